{{/* Name of the chart's objects: short when the release is named like the chart. */}}
{{- define "ambient-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ambient-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the operator's pods; never change them on upgrade. */}}
{{- define "ambient-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ambient-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ambient-operator.labels" -}}
{{ include "ambient-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: istio-ambient
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "ambient-operator.serviceAccountName" -}}
{{- default (include "ambient-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The operator image: under `registry` while image.repository keeps its default. */}}
{{- define "ambient-operator.image" -}}
{{- $repository := .Values.image.repository -}}
{{- if and .Values.registry (eq $repository "ambient-operator") -}}
{{- $repository = printf "%s/%s" .Values.registry $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "ambient-operator.replicas" -}}
{{- if .Values.highAvailability.enabled -}}
{{- .Values.highAvailability.replicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Whether the operator keeps the webhook's TLS material in its own Secret. */}}
{{- define "ambient-operator.ownsWebhookSecret" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{- define "ambient-operator.webhookCertSecret" -}}
{{- printf "%s-webhook-cert" (include "ambient-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Rules that values.schema.json cannot state across keys; each failure names
the values to change.
*/}}
{{- define "ambient-operator.validate" -}}
{{- $kube := .Capabilities.KubeVersion -}}
{{- if and (eq $kube.Major "1") (lt (int (trimSuffix "+" $kube.Minor)) 30) -}}
{{- fail (printf "Kubernetes %s is not supported: the chart needs 1.30 or later" $kube.Version) -}}
{{- end -}}
{{- $replicas := int (include "ambient-operator.replicas" .) -}}
{{- if and (gt $replicas 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "%d replicas need leaderElection.enabled=true: without a Lease every replica reconciles and they fight over the same objects" $replicas) -}}
{{- end -}}
{{- if and .Values.highAvailability.enabled (lt $replicas 2) -}}
{{- fail "highAvailability.enabled needs highAvailability.replicas of 2 or more" -}}
{{- end -}}
{{- if and .Values.highAvailability.enabled (ge (int .Values.highAvailability.minAvailable) $replicas) -}}
{{- fail (printf "highAvailability.minAvailable (%d) must be below highAvailability.replicas (%d), or no node could ever be drained" (int .Values.highAvailability.minAvailable) $replicas) -}}
{{- end -}}
{{- if and .Values.webhook.enabled (eq (int .Values.webhook.port) (int .Values.metrics.port)) -}}
{{- fail "webhook.port and metrics.port must differ" -}}
{{- end -}}
{{- if eq (int .Values.health.port) (int .Values.metrics.port) -}}
{{- fail "health.port and metrics.port must differ" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (eq (int .Values.webhook.port) (int .Values.health.port)) -}}
{{- fail "webhook.port and health.port must differ" -}}
{{- end -}}
{{- if .Values.ambientMesh.create -}}
{{- $spec := .Values.ambientMesh.spec | default dict -}}
{{- $namespace := $spec.namespace | default "istio-system" -}}
{{- if not (has $namespace .Values.agents.namespaces) -}}
{{- fail (printf "ambientMesh.spec.namespace %s is not in agents.namespaces %v: the operator would refuse it" $namespace .Values.agents.namespaces) -}}
{{- end -}}
{{- $class := (($spec.waypoints | default dict).className) | default .Values.waypoints.className -}}
{{- if ne $class .Values.waypoints.className -}}
{{- fail (printf "ambientMesh.spec.waypoints.className %s differs from waypoints.className %s, the only GatewayClass the operator may change" $class .Values.waypoints.className) -}}
{{- end -}}
{{- end -}}
{{- end -}}
