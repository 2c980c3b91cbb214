{{/* Names, labels and images shared by every template of the chart. */}}

{{- define "mmprep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's operator name; everything the chart creates is named after it. */}}
{{- define "mmprep.fullname" -}}
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

{{- define "mmprep.operatorName" -}}
{{- printf "%s-operator" (include "mmprep.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mmprep.labels" -}}
{{ include "mmprep.releaseLabels" . }}
app.kubernetes.io/component: operator
{{- end }}
{{/* The release's labels without a component: objects that are not the operator's add their own. */}}
{{- define "mmprep.releaseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "mmprep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mmprep
{{- end }}

{{- define "mmprep.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mmprep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "mmprep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mmprep.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
repository:tag, or repository@digest when a digest is given; tag defaults to appVersion.
global.imageRegistry (the user's own registry) prefixes a repository that names no registry of its
own: a first path segment with a dot or a port, or localhost, is a registry and is kept.
*/}}
{{- define "mmprep.image" -}}
{{- $repository := .repository }}
{{- $first := first (splitList "/" $repository) }}
{{- $hasRegistry := and (contains "/" $repository) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- if and .registry (not $hasRegistry) }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .registry) $repository }}
{{- end }}
{{- if .digest }}
{{- printf "%s@%s" $repository .digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .appVersion .tag) }}
{{- end }}
{{- end }}

{{- define "mmprep.imageContext" -}}
{{- toJson (dict "appVersion" .Chart.AppVersion "registry" ((.Values.global | default dict).imageRegistry | default "")) }}
{{- end }}

{{- define "mmprep.operatorImage" -}}
{{- include "mmprep.image" (merge (include "mmprep.imageContext" . | fromJson) .Values.image) }}
{{- end }}

{{- define "mmprep.runtimeImage" -}}
{{- include "mmprep.image" (merge (include "mmprep.imageContext" . | fromJson) .Values.runtimeImage) }}
{{- end }}

{{- define "mmprep.vllmRenderImage" -}}
{{- include "mmprep.image" (merge (include "mmprep.imageContext" . | fromJson) .Values.vllmRenderImage) }}
{{- end }}

{{/* Namespaces the operator watches and is granted namespaced rights in; empty = all. */}}
{{- define "mmprep.watchNamespaces" -}}
{{- $ns := list }}
{{- range .Values.watchNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- if and .Values.watchNamespaces .Values.watchReleaseNamespace (not (has .Release.Namespace $ns)) }}
{{- $ns = append $ns .Release.Namespace }}
{{- end }}
{{- toJson $ns }}
{{- end }}
