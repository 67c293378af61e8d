{{- define "tessera.ns" -}}{{ .Values.namespace.name }}{{- end -}}

{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: tessera
{{- end -}}

{{- define "tessera.checkMode" -}}
{{- if not (has .Values.mode (list "second-scheduler" "extender")) -}}
{{- fail (printf "mode must be second-scheduler or extender, not %q" .Values.mode) -}}
{{- end -}}
{{- end -}}

{{- define "tessera.managedResources" -}}
- name: tessera.dev/gpu-core
  ignoredByScheduler: false
- name: tessera.dev/gpu-memory-ratio
  ignoredByScheduler: false
- name: tessera.dev/gpu-memory
  ignoredByScheduler: false
- name: tessera.dev/gpu
  ignoredByScheduler: false
- name: tessera.dev/rdma
  ignoredByScheduler: false
{{- if .Values.scheduler.manageNvidiaGpu }}
- name: nvidia.com/gpu
  ignoredByScheduler: false
{{- end }}
{{- end -}}
