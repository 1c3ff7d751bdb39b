{{/* Names, labels, images and the TLS Secret names of the fedsched-hub chart. */}}

{{- define "fedsched-hub.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fedsched-hub.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fedsched-hub.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Standard labels; call with (dict "ctx" $ "component" "superlink"). */}}
{{- define "fedsched-hub.labels" -}}
helm.sh/chart: {{ include "fedsched-hub.chart" .ctx }}
{{ include "fedsched-hub.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: fedsched
{{- end -}}

{{- define "fedsched-hub.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fedsched-hub.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: repository:tag or repository@digest; call with (dict "image" ... "default" ...). */}}
{{- define "fedsched-hub.imageRef" -}}
{{- $repo := .image.repository | default .default.repository -}}
{{- $tag := .image.tag | default .default.tag -}}
{{- $digest := .image.digest | default "" -}}
{{- if $digest -}}
{{- printf "%s@%s" $repo $digest -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{- define "fedsched-hub.image" -}}
{{- include "fedsched-hub.imageRef" (dict "image" .Values.image "default" .Values.image) -}}
{{- end -}}

{{- define "fedsched-hub.superlinkImage" -}}
{{- include "fedsched-hub.imageRef" (dict "image" .Values.superlink.image "default" .Values.image) -}}
{{- end -}}

{{- define "fedsched-hub.superlinkName" -}}
{{- printf "%s-superlink" (include "fedsched-hub.fullname" .) -}}
{{- end -}}

{{/* The SuperLink Service's DNS name: what the gateway and the SuperExec connect to and verify. */}}
{{- define "fedsched-hub.superlinkHost" -}}
{{- printf "%s.%s.svc" (include "fedsched-hub.superlinkName" .) .Release.Namespace -}}
{{- end -}}

{{- define "fedsched-hub.superlinkTlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- printf "%s-superlink-tls" (include "fedsched-hub.fullname" .) -}}
{{- else -}}
{{- required "tls.superlink.existingSecret is required unless tls.certManager.enabled" .Values.tls.superlink.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "fedsched-hub.gatewayTlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- printf "%s-gateway-tls" (include "fedsched-hub.fullname" .) -}}
{{- else -}}
{{- required "tls.gateway.existingSecret is required unless tls.certManager.enabled" .Values.tls.gateway.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "fedsched-hub.clientCASecret" -}}
{{- .Values.gateway.clientCA.existingSecret | default (include "fedsched-hub.gatewayTlsSecret" .) -}}
{{- end -}}

{{- define "fedsched-hub.clientCAKey" -}}
{{- if .Values.gateway.clientCA.existingSecret -}}{{ .Values.gateway.clientCA.key }}{{- else -}}ca.crt{{- end -}}
{{- end -}}

{{/* Environment of every Flower process: no telemetry, no update check, no runtime `uv sync`. */}}
{{- define "fedsched-hub.flowerEnv" -}}
- name: FLWR_TELEMETRY_ENABLED
  value: {{ ternary "1" "0" .Values.flowerTelemetry | quote }}
- name: FLWR_DISABLE_UPDATE_CHECK
  value: "1"
- name: FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION
  value: "1"
- name: FLWR_HOME
  value: /tmp/flwr-home
- name: HOME
  value: /tmp
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{- define "fedsched-hub.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{- define "fedsched-hub.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end -}}
