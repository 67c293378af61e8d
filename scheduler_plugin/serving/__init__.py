"""The HTTP edge: the servers, their protocols (HTTP/1.1, HTTP/2), the bounds and who may
call what."""
