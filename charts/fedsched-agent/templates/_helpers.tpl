{{/* Names, labels, images and Secret names of the fedsched-agent chart. */}}

{{- define "fedsched-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fedsched-agent.fullname" -}}
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

{{- define "fedsched-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Standard labels; call with (dict "ctx" $ "component" "superlink"). */}}
{{- define "fedsched-agent.labels" -}}
helm.sh/chart: {{ include "fedsched-agent.chart" .ctx }}
{{ include "fedsched-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: fedsched
{{- end -}}

{{- define "fedsched-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fedsched-agent.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: repository:tag or repository@digest; call with (dict "image" ... "default" ...). */}}
{{- define "fedsched-agent.imageRef" -}}
{{- $repo := .image.repository | default .default.repository -}}
{{- $tag := .image.tag | default .default.tag -}}
{{- $digest := .image.digest | default "" -}}
{{- if $digest -}}
{{- printf "%s@%s" $repo $digest -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{- define "fedsched-agent.image" -}}
{{- include "fedsched-agent.imageRef" (dict "image" .Values.image "default" .Values.image) -}}
{{- end -}}

{{/* Environment of every Flower process: no telemetry, no update check, no runtime `uv sync`. */}}
{{- define "fedsched-agent.flowerEnv" -}}
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

{{- define "fedsched-agent.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{- define "fedsched-agent.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end -}}

{{/* A Secret name: the cert-manager one (<fullname>-<suffix>) or the required existing one. */}}
{{- define "fedsched-agent.tlsSecret" -}}
{{- if .ctx.Values.tls.certManager.enabled -}}
{{- printf "%s-%s" (include "fedsched-agent.fullname" .ctx) .suffix -}}
{{- else -}}
{{- required (printf "%s is required unless tls.certManager.enabled" .value) .existing -}}
{{- end -}}
{{- end -}}

{{- define "fedsched-agent.extenderSecret" -}}
{{- include "fedsched-agent.tlsSecret" (dict "ctx" . "suffix" "extender-tls" "value" "extender.existingSecret" "existing" .Values.extender.existingSecret) -}}
{{- end -}}

{{- define "fedsched-agent.schedulerSecret" -}}
{{- include "fedsched-agent.tlsSecret" (dict "ctx" . "suffix" "scheduler-tls" "value" "scheduler.existingSecret" "existing" .Values.scheduler.existingSecret) -}}
{{- end -}}

{{- define "fedsched-agent.sidecarSecret" -}}
{{- include "fedsched-agent.tlsSecret" (dict "ctx" . "suffix" "sidecar-tls" "value" "federation.sidecarSecret" "existing" .Values.federation.sidecarSecret) -}}
{{- end -}}

{{- define "fedsched-agent.extenderService" -}}
{{- printf "%s-extender" (include "fedsched-agent.fullname" .) -}}
{{- end -}}

{{/* The extender's DNS name: kube-scheduler's urlPrefix host and tlsConfig.serverName. */}}
{{- define "fedsched-agent.extenderHost" -}}
{{- printf "%s.%s.svc" (include "fedsched-agent.extenderService" .) .Release.Namespace -}}
{{- end -}}

{{- define "fedsched-agent.hubName" -}}
{{- .Values.federation.hub.serverName | default .Values.federation.hub.host -}}
{{- end -}}

{{/* files/stunnel.conf (rendered from coordinator/mtls.py) with the hub's address filled in. */}}
{{- define "fedsched-agent.stunnelConf" -}}
{{- $hub := .Values.federation.hub -}}
{{- .Files.Get "files/stunnel.conf" | replace "@HUB_HOST@:1" (printf "%s:%d" $hub.host (int $hub.port)) | replace "@HUB_NAME@" (include "fedsched-agent.hubName" .) -}}
{{- end -}}

{{/* The SuperNode's --node-config: the member's data for the ClientApp (client_app.py). */}}
{{- define "fedsched-agent.nodeConfig" -}}
{{- $fed := .Values.federation -}}
{{- $parts := list (printf "cluster-name=%s" ($fed.clusterName | quote)) "decision-log=\"/var/lib/fedsched/decisions\"" (printf "window=%d" (int $fed.window)) "serve-policy=\"/var/lib/fedsched/policy.pt\"" -}}
{{- if $fed.data.nodesCsv -}}
{{- $parts = append $parts (printf "nodes-csv=%s" ($fed.data.nodesCsv | quote)) -}}
{{- $parts = append $parts (printf "pods-csv=%s" ($fed.data.podsCsv | quote)) -}}
{{- else if .Values.recorder.enabled -}}
{{- $parts = append $parts "nodes-csv=\"/var/lib/fedsched/twin/nodes.csv\"" -}}
{{- $parts = append $parts "pods-csv=\"/var/lib/fedsched/twin/pods.csv\"" -}}
{{- end -}}
{{- join " " $parts -}}
{{- end -}}
