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

{{/* The NRI hook's isolation flags (docs/isolation.md): GPU shares left unlimited must be
chosen twice, as the hook itself demands. */}}
{{- define "tessera.isolationArgs" -}}
{{- $hook := .Values.nriHook -}}
{{- if eq $hook.isolation "hami-core" -}}
- --isolation=hami-core
{{- with $hook.hamiCoreLibrary }}
- --hami-core-library={{ . }}
{{- end }}
{{- else if eq $hook.isolation "mps" -}}
- --isolation=mps
- --mps-pipe-dir={{ $hook.mpsPipeDir }}
- --mps-client-user={{ .Values.isolation.mps.clientUser }}
{{- else if eq $hook.isolation "none" -}}
{{- if not $hook.allowUnisolatedSharing -}}
{{- fail "nriHook.isolation=none leaves GPU shares unlimited in memory and compute: choose hami-core or mps, or also set nriHook.allowUnisolatedSharing=true" -}}
{{- end -}}
- --isolation=none
- --allow-unisolated-sharing
{{- else -}}
{{- fail (printf "nriHook.isolation must be hami-core, mps or none, not %q" $hook.isolation) -}}
{{- end -}}
{{- end -}}

{{/* The node agent's isolation flags: the same layer and paths as the hook's. */}}
{{- define "tessera.agentIsolationArgs" -}}
{{- $hook := .Values.nriHook -}}
- --isolation={{ $hook.isolation }}
{{- if eq $hook.isolation "hami-core" }}
- --hami-core-library={{ $hook.hamiCoreLibrary }}
{{- else if eq $hook.isolation "mps" }}
- --mps-pipe-dir={{ $hook.mpsPipeDir }}
{{- end }}
- --host-root=/host
{{- end -}}

{{/* Whether the NRI hook's pod installs HAMi-core's library from the image first. */}}
{{- define "tessera.installsHamiCore" -}}
{{- if and (eq .Values.nriHook.isolation "hami-core") .Values.nriHook.hamiCoreLibrary .Values.isolation.hamiCore.install -}}
true
{{- end -}}
{{- end -}}

{{/* The host directory the hook checks the layer's files in (mounted under /host). */}}
{{- define "tessera.isolationDir" -}}
{{- if and (eq .Values.nriHook.isolation "hami-core") .Values.nriHook.hamiCoreLibrary -}}
{{ dir .Values.nriHook.hamiCoreLibrary }}
{{- else if eq .Values.nriHook.isolation "mps" -}}
{{ .Values.nriHook.mpsPipeDir }}
{{- end -}}
{{- end -}}
