{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "kelvin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every object: "<release>-kelvin", or the release name when it already says kelvin. */}}
{{- define "kelvin.fullname" -}}
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

{{/* Name of one component's objects: kelvin.componentName (dict "root" $ "component" "exporter"). */}}
{{- define "kelvin.componentName" -}}
{{- printf "%s-%s" (include "kelvin.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kelvin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "kelvin.labels" -}}
helm.sh/chart: {{ include "kelvin.chart" . }}
app.kubernetes.io/name: {{ include "kelvin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kelvin
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: kelvin.selectorLabels (dict "root" $ "component" "operator"). */}}
{{- define "kelvin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kelvin.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects. */}}
{{- define "kelvin.componentLabels" -}}
{{ include "kelvin.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kelvin.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The policy ConfigMap's name and the checksum that rolls the pods mounting it. */}}
{{- define "kelvin.policyConfigMap" -}}
{{- include "kelvin.componentName" (dict "root" . "component" "policy") }}
{{- end }}

{{- define "kelvin.policyChecksum" -}}
{{- include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end }}

{{/* Pod-level security context of the "restricted" Pod Security level. */}}
{{- define "kelvin.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security context of the "restricted" Pod Security level, read-only root filesystem. */}}
{{- define "kelvin.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Names of the scheduler, extender, exporter and operator objects. */}}
{{- define "kelvin.schedulerName" -}}
{{- include "kelvin.componentName" (dict "root" . "component" "scheduler") }}
{{- end }}

{{- define "kelvin.exporterName" -}}
{{- include "kelvin.componentName" (dict "root" . "component" "exporter") }}
{{- end }}

{{- define "kelvin.operatorName" -}}
{{- include "kelvin.componentName" (dict "root" . "component" "operator") }}
{{- end }}

{{- define "kelvin.webhookName" -}}
{{- include "kelvin.componentName" (dict "root" . "component" "webhook") }}
{{- end }}

{{- define "kelvin.webhookSecretName" -}}
{{- printf "%s-tls" (include "kelvin.webhookName" .) }}
{{- end }}

{{/* Namespaces the webhooks must never see: kube-system, the release namespace and the configured ones. */}}
{{- define "kelvin.webhookExcludedNamespaces" -}}
{{- $ns := list "kube-system" .Release.Namespace }}
{{- range .Values.operator.webhook.excludeNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- toYaml (uniq $ns) }}
{{- end }}

{{/* Spread a component's replicas across nodes unless the user set an affinity. */}}
{{- define "kelvin.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "kelvin.selectorLabels" . | nindent 12 }}
{{- end }}

{{/*
Webhook TLS material when cert-manager is off: reuse the Secret of a previous install (lookup, so upgrades keep the
same CA), else generate a CA and a serving certificate. Generated once per render and shared by the Secret and the
webhook configurations through the top-level context; returns YAML with caCert, cert and key (PEM).
*/}}
{{- define "kelvin.webhookTLS" -}}
{{- if not (hasKey $ "kelvinWebhookTLS") }}
{{- $secretName := include "kelvin.webhookSecretName" . }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName }}
{{- $tls := dict }}
{{- if and $existing (index ($existing.data | default dict) "ca.crt") }}
{{- $_ := set $tls "caCert" (index $existing.data "ca.crt" | b64dec) }}
{{- $_ := set $tls "cert" (index $existing.data "tls.crt" | b64dec) }}
{{- $_ := set $tls "key" (index $existing.data "tls.key" | b64dec) }}
{{- else }}
{{- $svc := include "kelvin.webhookName" . }}
{{- $days := int .Values.operator.webhook.tls.validityDays }}
{{- $ca := genCA (printf "%s-ca" $svc) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc .Release.Namespace) nil $dns $days $ca }}
{{- $_ := set $tls "caCert" $ca.Cert }}
{{- $_ := set $tls "cert" $cert.Cert }}
{{- $_ := set $tls "key" $cert.Key }}
{{- end }}
{{- $_ := set $ "kelvinWebhookTLS" $tls }}
{{- end }}
{{- toYaml (get $ "kelvinWebhookTLS") }}
{{- end }}

{{/* "true" when Helm generates the webhook's CA and key (neither cert-manager nor an external Secret); else "".
     Both set at once is refused. */}}
{{- define "kelvin.webhookTLSByHelm" -}}
{{- $tls := .Values.operator.webhook.tls }}
{{- if and $tls.external $tls.certManager.enabled }}
{{- fail "operator.webhook.tls.external and operator.webhook.tls.certManager.enabled are both set: choose one source of the webhook certificate" }}
{{- end }}
{{- if not (or $tls.external $tls.certManager.enabled) }}true{{ end }}
{{- end }}

{{/* Annotations or caBundle a webhook configuration needs for its CA. */}}
{{- define "kelvin.webhookCAAnnotations" -}}
{{- if .Values.operator.webhook.tls.certManager.enabled }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "kelvin.webhookName" .) }}
{{- end }}
{{- end }}

{{/* Telemetry settings (KELVIN_* env) shared by the extender and the operator: both read the same GPU telemetry. */}}
{{- define "kelvin.telemetryEnv" -}}
{{- $x := .Values.extender -}}
- name: KELVIN_POLICY_FILE
  value: /etc/kelvin/policy.yaml
- name: KELVIN_SOURCE
  value: {{ $x.source | quote }}
- name: KELVIN_REFRESH_INTERVAL_S
  value: {{ $x.refreshIntervalSeconds | quote }}
{{- if eq $x.source "prometheus" }}
- name: KELVIN_PROMETHEUS_URL
  value: {{ $x.prometheusUrl | quote }}
- name: KELVIN_PROMETHEUS_METRICS
  value: {{ $x.prometheusMetrics | quote }}
{{- end }}
{{- if eq $x.source "scrape" }}
- name: KELVIN_SCRAPE_SERVICE
  value: {{ include "kelvin.exporterName" . | quote }}
- name: KELVIN_SCRAPE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: KELVIN_SCRAPE_PORT
  value: {{ .Values.exporter.port | quote }}
{{- end }}
{{- end }}

{{/* "true" when the cluster serves the Prometheus Operator's API (monitoring.coreos.com/v1), else "". `helm template`
knows no cluster: pass --api-versions monitoring.coreos.com/v1. */}}
{{- define "kelvin.hasPrometheusOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* "true" when kelvin's device plugin advertises kelvin.dev/shared-gpu (deployed, and serving that name in
devicePlugin.resourceNames), else "false": the operator's webhook.sharedGpuResource. Only then may the mutating webhook
request kelvin.dev/shared-gpu for a pool-only pod; otherwise no node would have it and the pod would stay Pending. */}}
{{- define "kelvin.sharedGpuResource" -}}
{{- $dp := .Values.devicePlugin | default dict }}
{{- and ($dp.enabled | default false) (has "kelvin.dev/shared-gpu" ($dp.resourceNames | default list)) | toString }}
{{- end }}

{{/* Whether the shared-GPU switch is on but kube-scheduler would not send kelvin.dev/shared-gpu pods to the extender:
then fail (the scheduler ConfigMap includes this). */}}
{{- define "kelvin.checkSharedGpuManaged" -}}
{{- if eq (include "kelvin.sharedGpuResource" .) "true" }}
{{- $names := list }}
{{- range .Values.scheduler.extender.managedResources }}{{ $names = append $names .name }}{{ end }}
{{- if not (has "kelvin.dev/shared-gpu" $names) }}
{{- fail "scheduler.extender.managedResources must list kelvin.dev/shared-gpu when devicePlugin.enabled=true and devicePlugin.resourceNames serves it: the operator then adds kelvin.dev/shared-gpu to pool-only pods, and kube-scheduler sends a pod to the extender only for a managed resource (add {name: kelvin.dev/shared-gpu, ignoredByScheduler: false}, or drop kelvin.dev/shared-gpu from devicePlugin.resourceNames)" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The webhooks' matchConditions (CEL, evaluated by the API server; Kubernetes 1.28+ beta on by default, GA in 1.30):
call the webhook only for a pod that requests a GPU resource of scheduler.extender.managedResources (requests or
limits, any container or init container) or carries a kelvin.dev/ annotation. Every field that may be absent is
guarded with has(), so the expression never errors (an error would apply the failurePolicy).
*/}}
{{- define "kelvin.webhookMatchConditions" -}}
{{- $names := list }}
{{- range .Values.scheduler.extender.managedResources }}{{ $names = append $names (printf "'%s'" .name) }}{{ end }}
{{- $gpus := printf "[%s]" (join ", " $names) }}
{{- $asks := printf "has(c.resources) && ((has(c.resources.requests) && c.resources.requests.exists(r, r in %s)) || (has(c.resources.limits) && c.resources.limits.exists(r, r in %s)))" $gpus $gpus -}}
- name: kelvin-gpu-pods
  expression: >-
    (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('kelvin.dev/')))
    || object.spec.containers.exists(c, {{ $asks }})
    || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $asks }}))
{{- end }}

{{/* The Prometheus peer of the NetworkPolicies (both selectors: pods matching podSelector in namespaces matching
namespaceSelector). */}}
{{- define "kelvin.prometheusPeer" -}}
{{- $p := .Values.networkPolicy.prometheus -}}
- namespaceSelector:
    {{- toYaml ($p.namespaceSelector | default dict) | nindent 4 }}
  podSelector:
    {{- toYaml ($p.podSelector | default dict) | nindent 4 }}
{{- end }}
