{{/* Names, labels and the derived settings every template shares. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "kubetrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<name>" (or just the release when it already contains the name), or
fullnameOverride; 63 characters at most, as object names and label values allow. */}}
{{- define "kubetrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kubetrain.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* helm.sh/chart: "<chart>-<version>". */}}
{{- define "kubetrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels that select the operator pods (immutable in a Deployment: never add to them). */}}
{{- define "kubetrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The recommended labels, on every object. */}}
{{- define "kubetrain.labels" -}}
helm.sh/chart: {{ include "kubetrain.chart" . }}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubetrain
{{- end }}

{{- define "kubetrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "registry/repository:tag" of an image value; the tag defaults to the chart's appVersion. */}}
{{- define "kubetrain.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- $repository := $image.repository }}
{{- if $image.registry }}
{{- $repository = printf "%s/%s" $image.registry $image.repository }}
{{- end }}
{{- printf "%s:%s" $repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/* "true" when the operator takes a Lease: asked for, or needed because replicas > 1. */}}
{{- define "kubetrain.leaderElect" -}}
{{- if or .Values.operator.leaderElection.enabled (gt (int .Values.operator.replicas) 1) }}true{{ end }}
{{- end }}

{{- define "kubetrain.leaseNamespace" -}}
{{- default .Release.Namespace .Values.operator.leaderElection.namespace }}
{{- end }}

{{- define "kubetrain.leaseName" -}}
{{- default (include "kubetrain.fullname" .) .Values.operator.leaderElection.id }}
{{- end }}

{{/* The operator's API rules on namespaced resources (docs/INSTALL.md, "RBAC"): one list for
the cluster-wide ClusterRole and the namespace-scoped Role. Exactly the calls operator/controller
and operator/kube make; tests/chart/chart_test.sh compares them with the code. */}}
{{- define "kubetrain.namespacedRules" -}}
- apiGroups: [kubetrain.dev]
  resources: [trainingjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [kubetrain.dev]
  resources: [trainingjobs/status]
  verbs: [update]
- apiGroups: [kubetrain.dev]
  resources: [trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [scheduling.x-k8s.io, scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, create, update]
{{- end }}
