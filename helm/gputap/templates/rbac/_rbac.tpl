{{/* The namespace of servers' pods and disks (spawner.kubernetes.namespace; empty: the
release's, as the hub's configuration has it). */}}
{{- define "gputap.serversNamespace" -}}
{{- $kube := (((.Values.jupyterhub.custom).gputap).spawner).kubernetes | default dict -}}
{{- $kube.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The ServiceAccount of z2jh's hub pod (z2jh's hub.serviceAccount.name, else "hub"). */}}
{{- define "gputap.hubServiceAccount" -}}
{{- .Values.jupyterhub.hub.serviceAccount.name | default "hub" -}}
{{- end -}}
