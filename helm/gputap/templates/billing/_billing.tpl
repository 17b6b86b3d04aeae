{{/* Billing's pods: the labels its Service and Deployment select them by. */}}
{{- define "gputap.billing.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: billing
{{- end -}}

{{/* Billing's port: its setting jupyterhub.custom.gputap.billing.port (default 8091). */}}
{{- define "gputap.billing.port" -}}
{{- dig "custom" "gputap" "billing" "port" 8091 .Values.jupyterhub -}}
{{- end -}}

{{/* z2jh's hub.baseUrl with one trailing slash. */}}
{{- define "gputap.billing.baseUrl" -}}
{{- printf "%s/" (trimSuffix "/" (dig "hub" "baseUrl" "/" .Values.jupyterhub)) -}}
{{- end -}}

{{/* Where billing serves: JupyterHub's prefix for the service named billing. */}}
{{- define "gputap.billing.prefix" -}}
{{- include "gputap.billing.baseUrl" . }}services/billing/
{{- end -}}

{{/* Billing's settings file: only what billing reads of jupyterhub.custom.gputap (its own
section, the servers' namespace it meters and the environments a course may pin; never the
hub's secrets), its data on its own volume. The checksum of this text rolls billing's pods
when it changes. */}}
{{- define "gputap.billing.settings" -}}
{{- $gputap := dig "custom" "gputap" dict .Values.jupyterhub -}}
{{- $kube := deepCopy (dig "spawner" "kubernetes" dict $gputap) -}}
{{- if not $kube.namespace -}}
{{- $_ := set $kube "namespace" .Release.Namespace -}}
{{- end -}}
{{- $spawner := dict "backend" "kubernetes" "kubernetes" $kube -}}
{{- $settings := dict "data_dir" "/var/lib/gputap-billing" "billing" (dig "billing" dict $gputap) "spawner" $spawner -}}
{{- with $gputap.environments }}
{{- $_ := set $settings "environments" . -}}
{{- end }}
{{- toYaml $settings -}}
{{- end -}}

{{/* What billing's init container (upgrade-db) and billing itself share: image, settings,
database, hub token and the read-only, unprivileged container. */}}
{{- define "gputap.billing.container" -}}
{{- $ := index . 0 -}}
{{- $urlSecret := index . 1 -}}
{{- $prefix := index . 2 -}}
image: {{ index . 3 }}
imagePullPolicy: {{ $.Values.billing.image.pullPolicy | default "IfNotPresent" }}
env:
  - name: GPUTAP_SETTINGS
    value: /etc/gputap-billing/settings.yaml
  {{- with $urlSecret }}
  - name: GPUTAP__BILLING__DATABASE_URL
    valueFrom:
      secretKeyRef:
        name: {{ .name }}
        key: {{ .key }}
  {{- end }}
  # one cookie secret for every replica (secret.yaml)
  - name: GPUTAP_BILLING_COOKIE_SECRET
    valueFrom:
      secretKeyRef:
        name: {{ include "gputap.fullname" $ }}-billing
        key: cookie-secret
  # billing is a JupyterHub service; z2jh made its token (hub.services.billing)
  - name: JUPYTERHUB_API_TOKEN
    valueFrom:
      secretKeyRef:
        name: hub
        key: hub.services.billing.apiToken
  - name: JUPYTERHUB_API_URL
    value: {{ printf "http://hub:8081%shub/api" (include "gputap.billing.baseUrl" $) }}
  - name: JUPYTERHUB_BASE_URL
    value: {{ include "gputap.billing.baseUrl" $ }}
  - name: JUPYTERHUB_SERVICE_NAME
    value: billing
  - name: JUPYTERHUB_SERVICE_PREFIX
    value: {{ $prefix }}
  - name: JUPYTERHUB_SERVICE_URL
    value: {{ printf "http://0.0.0.0:%s" (include "gputap.billing.port" $) }}
  - name: JUPYTERHUB_CLIENT_ID
    value: service-billing
  - name: JUPYTERHUB_OAUTH_CALLBACK_URL
    value: {{ $prefix }}oauth_callback
volumeMounts:
  - name: settings
    mountPath: /etc/gputap-billing
    readOnly: true
  - name: data
    mountPath: /var/lib/gputap-billing
  - name: tmp
    mountPath: /tmp
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
{{- end -}}
