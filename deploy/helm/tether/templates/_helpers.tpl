{{/*
The chart's name, and the prefix of every object's name: "<release>-tether",
or the release name alone when it contains the chart's name (release
"tether" gives the names deploy/webhook uses: tether-webhook, ...).
*/}}
{{- define "tether.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tether.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Names of the webhook's objects. */}}
{{- define "tether.webhook.name" -}}
{{- printf "%s-webhook" (include "tether.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tether.webhook.tlsSecretName" -}}
{{- printf "%s-webhook-tls" (include "tether.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tether.webhook.configurationName" -}}
{{- printf "%s-sidecar-injector" (include "tether.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The DNS name the API server calls the webhook by. */}}
{{- define "tether.webhook.dnsName" -}}
{{- printf "%s.%s.svc" (include "tether.webhook.name" .) .Release.Namespace }}
{{- end }}

{{- define "tether.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "tether.labels" -}}
helm.sh/chart: {{ include "tether.chart" . }}
app.kubernetes.io/part-of: tether
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- end }}

{{/* The webhook's Pods: the selector (never changes after install) and the labels. */}}
{{- define "tether.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tether.webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tether.webhook.labels" -}}
{{ include "tether.labels" . }}
app.kubernetes.io/name: {{ include "tether.webhook.name" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{/* Images: the tag defaults to the chart's appVersion. */}}
{{- define "tether.webhook.image" -}}
{{- printf "%s:%s" .Values.webhook.image.repository (default .Chart.AppVersion .Values.webhook.image.tag) }}
{{- end }}

{{- define "tether.sidecar.image" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) }}
{{- end }}

{{/*
The webhook's serving certificate without cert-manager: the CA and the
pair in the Secret already installed when there is one (so an upgrade
keeps them, and the caBundle with them), else new ones. A dict of the
Secret's data keys, base64-encoded.
*/}}
{{- define "tether.webhook.certificate" -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "tether.webhook.tlsSecretName" .) }}
{{- if and $secret $secret.data (index $secret.data "ca.crt") (index $secret.data "tls.crt") (index $secret.data "tls.key") }}
ca.crt: {{ index $secret.data "ca.crt" }}
tls.crt: {{ index $secret.data "tls.crt" }}
tls.key: {{ index $secret.data "tls.key" }}
{{- else }}
{{- $days := int .Values.certificate.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "tether.webhook.name" .)) $days }}
{{- $dns := include "tether.webhook.dnsName" . }}
{{- $cert := genSignedCert $dns nil (list $dns (printf "%s.cluster.local" $dns)) $days $ca }}
ca.crt: {{ $ca.Cert | b64enc }}
tls.crt: {{ $cert.Cert | b64enc }}
tls.key: {{ $cert.Key | b64enc }}
{{- end }}
{{- end }}
