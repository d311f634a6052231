{{/* Names */}}
{{- define "faultline.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "faultline.fullname" -}}
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

{{/* Labels: include "faultline.labels" (dict "ctx" $ "component" "gateway") */}}
{{- define "faultline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "faultline.selectorLabels" . }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "faultline.selectorLabels" -}}
app.kubernetes.io/name: {{ include "faultline.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image: include "faultline.image" (dict "ctx" $ "name" "faultline") */}}
{{- define "faultline.image" -}}
{{- $i := .ctx.Values.image -}}
{{- $d := get $i.digests .name -}}
{{- if $d -}}
{{- printf "%s/%s@%s" $i.repository .name $d -}}
{{- else -}}
{{- printf "%s/%s:%s" $i.repository .name (default .ctx.Chart.AppVersion $i.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The component's settings: defaults with its overrides laid over them, two
levels deep (autoscaling.enabled: false overrides true; mergeOverwrite
would skip a false or 0), as YAML.
*/}}
{{- define "faultline.settings" -}}
{{- $out := deepCopy .ctx.Values.defaults -}}
{{- range $k, $v := deepCopy (default dict .overrides) }}
{{- $d := get $out $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $d) }}
{{- range $k2, $v2 := $v }}{{ $_ := set $d $k2 $v2 }}{{ end }}
{{- else }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- end }}
{{- toYaml $out -}}
{{- end -}}

{{/*
TOML rendering of a map: include "faultline.toml" (dict "m" $map "p" "")
Helm values hold numbers as float64; whole numbers are written as TOML
integers (the binaries' int fields refuse 1000.0). null values are left out.
*/}}
{{- define "faultline.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "faultline.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}{{ toJson $v }}
{{- else if kindIs "bool" $v -}}{{ ternary "true" "false" $v }}
{{- else if kindIs "float64" $v -}}
{{- if eq (float64 (int64 $v)) $v -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) -}}{{ $v }}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "faultline.toml.value" $e }}{{ end -}}]
{{- else -}}{{ fail (printf "cannot write %v (%s) as TOML" $v (kindOf $v)) }}
{{- end -}}
{{- end -}}

{{- define "faultline.toml.isTables" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) -}}
{{- $all := true -}}
{{- range . }}{{ if not (kindIs "map" .) }}{{ $all = false }}{{ end }}{{ end -}}
{{- if $all }}true{{ end -}}
{{- end -}}
{{- end -}}

{{- define "faultline.toml" -}}
{{- $m := .m -}}{{- $p := .p -}}
{{- range $k, $v := $m }}
{{- if and (not (kindIs "invalid" $v)) (not (kindIs "map" $v)) (not (include "faultline.toml.isTables" $v)) }}
{{ include "faultline.toml.key" $k }} = {{ include "faultline.toml.value" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := $m }}
{{- $path := include "faultline.toml.key" $k -}}
{{- if $p }}{{ $path = printf "%s.%s" $p $path }}{{ end -}}
{{- if kindIs "map" $v }}

[{{ $path }}]
{{- include "faultline.toml" (dict "m" $v "p" $path) }}
{{- else if include "faultline.toml.isTables" $v }}
{{- range $v }}

[[{{ $path }}]]
{{- include "faultline.toml" (dict "m" . "p" $path) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where secrets are mounted in the faultline pods. */}}
{{- define "faultline.secretDir" -}}/var/run/secrets/faultline{{- end -}}

{{/* The gateway's in-cluster gRPC address. */}}
{{- define "faultline.gatewayAddr" -}}
{{- if .Values.agent.gatewayAddr -}}{{ .Values.agent.gatewayAddr }}
{{- else -}}{{ printf "%s-gateway.%s.svc:%d" (include "faultline.fullname" .) .Release.Namespace (int .Values.gateway.service.grpcPort) }}
{{- end -}}
{{- end -}}

{{/* Roles that act on Kubernetes (mount kubeconfigs, get RBAC). */}}
{{- define "faultline.kubeRoles" -}}quarantine,drain,remediate,conformance,janitor{{- end -}}

{{/*
faultline's config.toml (gateway and roles): the user's config with the
keys the chart owns set from the structured values.
*/}}
{{- define "faultline.config" -}}
{{- $v := .Values -}}
{{- $dir := include "faultline.secretDir" . -}}
{{- $c := deepCopy (default dict $v.config) -}}
{{- $_ := set $c "metrics_addr" ":9464" -}}
{{- $k := dict "brokers" (required "kafka.brokers is required: the bootstrap brokers of your Kafka (host:port,...)" $v.kafka.brokers) "partitions" $v.kafka.partitions "replication_factor" $v.kafka.replicationFactor "min_insync_replicas" $v.kafka.minInsyncReplicas -}}
{{- if $v.kafka.sessionTimeout }}{{ $_ := set $k "session_timeout" $v.kafka.sessionTimeout }}{{ end -}}
{{- if $v.kafka.tls.enabled -}}
{{- $t := dict "enabled" true -}}
{{- if $v.kafka.tls.caSecret.name }}{{ $_ := set $t "ca_file" (printf "%s/kafka/ca.crt" $dir) }}{{ end -}}
{{- if $v.kafka.tls.clientSecret.name }}{{ $_ := set $t "cert_file" (printf "%s/kafka/tls.crt" $dir) }}{{ $_ := set $t "key_file" (printf "%s/kafka/tls.key" $dir) }}{{ end -}}
{{- if $v.kafka.tls.serverName }}{{ $_ := set $t "server_name" $v.kafka.tls.serverName }}{{ end -}}
{{- $_ := set $k "tls" $t -}}
{{- end -}}
{{- if $v.kafka.sasl.mechanism -}}
{{- $s := dict "mechanism" $v.kafka.sasl.mechanism -}}
{{- if $v.kafka.sasl.username }}{{ $_ := set $s "username" $v.kafka.sasl.username }}{{ end -}}
{{- if $v.kafka.sasl.passwordSecret.name }}{{ $_ := set $s "password_file" (printf "%s/kafka/password" $dir) }}{{ end -}}
{{- if $v.kafka.sasl.tokenSecret.name }}{{ $_ := set $s "token_file" (printf "%s/kafka/token" $dir) }}{{ end -}}
{{- $_ := set $k "sasl" $s -}}
{{- end -}}
{{- $_ := set $c "kafka" $k -}}
{{- $ch := dict "addr" (required "clickhouse.addr is required: your ClickHouse's native-protocol host:port" $v.clickhouse.addr) "database" $v.clickhouse.database "username" $v.clickhouse.username -}}
{{- if $v.clickhouse.passwordSecret.name }}{{ $_ := set $ch "password_file" (printf "%s/clickhouse/password" $dir) }}{{ end -}}
{{- if $v.clickhouse.cluster }}{{ $_ := set $ch "cluster" $v.clickhouse.cluster }}{{ end -}}
{{- if $v.clickhouse.tls.enabled -}}
{{- $t := dict "enabled" true -}}
{{- if $v.clickhouse.tls.caSecret.name }}{{ $_ := set $t "ca_file" (printf "%s/clickhouse/ca.crt" $dir) }}{{ end -}}
{{- if $v.clickhouse.tls.serverName }}{{ $_ := set $t "server_name" $v.clickhouse.tls.serverName }}{{ end -}}
{{- $_ := set $ch "tls" $t -}}
{{- end -}}
{{- $_ := set $c "clickhouse" $ch -}}
{{- $g := deepCopy (default dict $c.gateway) -}}
{{- $_ := set $g "grpc_addr" (printf ":%d" (int $v.gateway.service.grpcPort)) -}}
{{- $_ := set $g "http_addr" (printf ":%d" (int $v.gateway.service.httpPort)) -}}
{{- $_ := set $g "tokens_file" (printf "%s/gateway/tokens" $dir) -}}
{{- if $v.gateway.tls.secretName -}}
{{- $_ := set $g "tls_cert" (printf "%s/gateway/tls.crt" $dir) -}}
{{- $_ := set $g "tls_key" (printf "%s/gateway/tls.key" $dir) -}}
{{- if $v.gateway.tls.clientCAKey }}{{ $_ := set $g "client_ca" (printf "%s/gateway/client-ca.crt" $dir) }}{{ end -}}
{{- end -}}
{{- $_ := set $c "gateway" $g -}}
{{- $kube := deepCopy (default dict $c.kube) -}}
{{- $clusters := list -}}
{{- if $v.kube.localCluster }}{{ $clusters = append $clusters (dict "name" $v.kube.localCluster "kubeconfig" "in-cluster") }}{{ end -}}
{{- range $v.kube.clusters -}}
{{- $cl := dict "name" .name "kubeconfig" (printf "%s/kube/%s/kubeconfig" $dir .name) -}}
{{- if .context }}{{ $_ := set $cl "context" .context }}{{ end -}}
{{- if .dryRun }}{{ $_ := set $cl "dry_run" true }}{{ end -}}
{{- $clusters = append $clusters $cl -}}
{{- end -}}
{{- if $clusters }}{{ $_ := set $kube "clusters" $clusters }}{{ end -}}
{{- if $v.kube.dryRunClusters }}{{ $_ := set $kube "dry_run_clusters" $v.kube.dryRunClusters }}{{ end -}}
{{- if $kube }}{{ $_ := set $c "kube" $kube }}{{ end -}}
{{- if $v.roles.correlate.rules -}}
{{- $r := deepCopy (default dict $c.correlate) }}{{ $_ := set $r "rules" "/etc/faultline/rules/correlate.toml" }}{{ $_ := set $c "correlate" $r -}}
{{- end -}}
{{- if $v.roles.quarantine.rules -}}
{{- $r := deepCopy (default dict $c.quarantine) }}{{ $_ := set $r "rules" "/etc/faultline/rules/quarantine.toml" }}{{ $_ := set $c "quarantine" $r -}}
{{- end -}}
{{- if $v.roles.janitor.enabled -}}
{{- /* The BMC credential Secrets and the janitor's Lease: in the release namespace unless config.janitor.redfish.secret_namespace and config.janitor.lease_namespace say. */ -}}
{{- $j := deepCopy (default dict $c.janitor) }}{{ $rf := default dict $j.redfish -}}
{{- if not $rf.secret_namespace }}{{ $_ := set $rf "secret_namespace" .Release.Namespace }}{{ end -}}
{{- if not $j.lease_namespace }}{{ $_ := set $j "lease_namespace" .Release.Namespace }}{{ end -}}
{{- $_ := set $j "redfish" $rf }}{{ $_ := set $c "janitor" $j -}}
{{- end -}}
{{- include "faultline.toml" (dict "m" $c "p" "") -}}
{{- end -}}

{{/*
The projected secret volume of a faultline pod: Kafka and ClickHouse
credentials (every pod: each binary validates them at start), plus the
gateway's own (gateway) or the member clusters' kubeconfigs (kube roles).
include "faultline.secretSources" (dict "ctx" $ "component" "gateway")
*/}}
{{- define "faultline.secretSources" -}}
{{- $v := .ctx.Values -}}
{{- $fn := include "faultline.fullname" .ctx -}}
{{- if and $v.kafka.tls.enabled $v.kafka.tls.caSecret.name }}
- secret:
    name: {{ $v.kafka.tls.caSecret.name }}
    items: [{key: {{ $v.kafka.tls.caSecret.key | quote }}, path: kafka/ca.crt}]
{{- end }}
{{- if and $v.kafka.tls.enabled $v.kafka.tls.clientSecret.name }}
- secret:
    name: {{ $v.kafka.tls.clientSecret.name }}
    items:
      - {key: {{ $v.kafka.tls.clientSecret.certKey | quote }}, path: kafka/tls.crt}
      - {key: {{ $v.kafka.tls.clientSecret.keyKey | quote }}, path: kafka/tls.key}
{{- end }}
{{- if and $v.kafka.sasl.mechanism $v.kafka.sasl.passwordSecret.name }}
- secret:
    name: {{ $v.kafka.sasl.passwordSecret.name }}
    items: [{key: {{ $v.kafka.sasl.passwordSecret.key | quote }}, path: kafka/password}]
{{- end }}
{{- if and $v.kafka.sasl.mechanism $v.kafka.sasl.tokenSecret.name }}
- secret:
    name: {{ $v.kafka.sasl.tokenSecret.name }}
    items: [{key: {{ $v.kafka.sasl.tokenSecret.key | quote }}, path: kafka/token}]
{{- end }}
{{- if $v.clickhouse.passwordSecret.name }}
- secret:
    name: {{ $v.clickhouse.passwordSecret.name }}
    items: [{key: {{ $v.clickhouse.passwordSecret.key | quote }}, path: clickhouse/password}]
{{- end }}
{{- if and $v.clickhouse.tls.enabled $v.clickhouse.tls.caSecret.name }}
- secret:
    name: {{ $v.clickhouse.tls.caSecret.name }}
    items: [{key: {{ $v.clickhouse.tls.caSecret.key | quote }}, path: clickhouse/ca.crt}]
{{- end }}
{{- if eq .component "gateway" }}
- secret:
    name: {{ default (printf "%s-gateway-tokens" $fn) $v.gateway.tokens.existingSecret }}
    items: [{key: {{ $v.gateway.tokens.key | quote }}, path: gateway/tokens}]
{{- if $v.gateway.tls.secretName }}
- secret:
    name: {{ $v.gateway.tls.secretName }}
    items:
      - {key: tls.crt, path: gateway/tls.crt}
      - {key: tls.key, path: gateway/tls.key}
      {{- if $v.gateway.tls.clientCAKey }}
      - {key: {{ $v.gateway.tls.clientCAKey | quote }}, path: gateway/client-ca.crt}
      {{- end }}
{{- end }}
{{- end }}
{{- if and (eq .component "janitor") $v.roles.janitor.localSigningKeySecret.name }}
- secret:
    name: {{ $v.roles.janitor.localSigningKeySecret.name }}
    items: [{key: {{ $v.roles.janitor.localSigningKeySecret.key | quote }}, path: janitor/local-actions.key}]
{{- end }}
{{- if has .component (splitList "," (include "faultline.kubeRoles" .ctx)) }}
{{- range $v.kube.clusters }}
- secret:
    name: {{ .kubeconfigSecret.name }}
    items: [{key: {{ default "kubeconfig" .kubeconfigSecret.key | quote }}, path: {{ printf "kube/%s/kubeconfig" .name }}}]
{{- end }}
{{- end }}
{{- end -}}

{{/* Non-empty when any processor role is enabled. */}}
{{- define "faultline.anyRole" -}}
{{- range $name, $r := .Values.roles }}{{ if $r.enabled }}{{ $name }}{{ end }}{{ end -}}
{{- end -}}

{{/*
GOMEMLIMIT of a container: 90% of its memory limit, in bytes. Without it the
Go runtime lets the heap grow to twice what is live before it collects, so
a role holding half its limit (correlate's remembered records, quarantine's
node watch of many clusters) is killed by the kernel (OOMKilled) instead of
collecting. "" when the container has no memory limit, the limit is not a
whole number with an optional Ki/Mi/Gi/Ti/k/M/G/T suffix, or env sets
GOMEMLIMIT already.
include "faultline.gomemlimit" (dict "resources" $resources "env" $env)
*/}}
{{- define "faultline.gomemlimit" -}}
{{- $q := dig "limits" "memory" "" (default dict .resources) -}}
{{- if kindIs "float64" $q }}{{ $q = int64 $q }}{{ end -}}
{{- $q = toString $q -}}
{{- $own := false -}}
{{- range .env }}{{ if eq (toString .name) "GOMEMLIMIT" }}{{ $own = true }}{{ end }}{{ end -}}
{{- if and (not $own) (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q) -}}
{{- $n := regexFind "^[0-9]+" $q -}}
{{- $unit := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000) (trimPrefix $n $q) -}}
{{- div (mul (atoi $n) $unit 9) 10 -}}
{{- end -}}
{{- end -}}

{{/* Pod and container security of the faultline Deployments. */}}
{{- define "faultline.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "faultline.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/*
faultline.roleBinding binds the Role .name in .namespace to the
ServiceAccount .serviceAccount of the release namespace (labels of
.component).
*/}}
{{- define "faultline.roleBinding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "faultline.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .serviceAccount }}
    namespace: {{ .ctx.Release.Namespace }}
{{- end -}}

{{/*
A faultline Deployment with its HPA and PDB:
include "faultline.workload" (dict "ctx" $ "component" "store" "args" (list ...) "overrides" {...})
*/}}
{{- define "faultline.workload" -}}
{{- $ctx := .ctx -}}
{{- $fn := include "faultline.fullname" $ctx -}}
{{- $s := include "faultline.settings" (dict "ctx" $ctx "overrides" .overrides) | fromYaml -}}
{{- $name := printf "%s-%s" $fn .component -}}
{{- $kube := has .component (splitList "," (include "faultline.kubeRoles" $ctx)) -}}
{{- $sources := include "faultline.secretSources" (dict "ctx" $ctx "component" .component) -}}
{{- /* What else the component reads only at start from what the chart writes: a change rolls its pods.
Never secret material: a hash of it in the pod template could be brute-forced (the gateway follows its tokens file instead). */ -}}
{{- $files := "" -}}
{{- if eq .component "quarantine" }}{{ $files = $ctx.Values.roles.quarantine.rules }}{{ end -}}
{{- if eq .component "correlate" }}{{ $files = $ctx.Values.roles.correlate.rules }}{{ end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "faultline.labels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
spec:
  {{- if not $s.autoscaling.enabled }}
  replicas: {{ $s.replicas }}
  {{- end }}
  {{- with .strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "faultline.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "faultline.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 8 }}
      annotations:
        checksum/config: {{ include "faultline.config" $ctx | sha256sum }}
        {{- if $files }}
        checksum/files: {{ $files | sha256sum }}
        {{- end }}
        {{- with $s.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      automountServiceAccountToken: {{ and $kube (ne $ctx.Values.kube.localCluster "") }}
      securityContext:
        {{- include "faultline.podSecurity" $ctx | nindent 8 }}
      {{- with $ctx.Values.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "faultline.image" (dict "ctx" $ctx "name" "faultline") }}
          imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          {{- $gml := include "faultline.gomemlimit" (dict "resources" $s.resources "env" $s.env) }}
          {{- if or $s.env $gml }}
          env:
            {{- with $s.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- if $gml }}
            - {name: GOMEMLIMIT, value: {{ $gml | quote }}}
            {{- end }}
          {{- end }}
          ports:
            {{- toYaml .ports | nindent 12 }}
          {{- /* probeScheme HTTPS: the port serves TLS only (the gateway with a certificate); the kubelet does not verify the certificate. */}}
          readinessProbe:
            httpGet: {path: {{ .readyPath }}, port: {{ .probePort }}{{ with .probeScheme }}, scheme: {{ . }}{{ end }}}
            periodSeconds: 10
          livenessProbe:
            httpGet: {path: /healthz, port: {{ .probePort }}{{ with .probeScheme }}, scheme: {{ . }}{{ end }}}
            periodSeconds: 20
            failureThreshold: 6
          resources:
            {{- toYaml $s.resources | nindent 12 }}
          securityContext:
            {{- include "faultline.containerSecurity" $ctx | nindent 12 }}
          volumeMounts:
            - {name: config, mountPath: /etc/faultline/config.toml, subPath: config.toml, readOnly: true}
            {{- if or $ctx.Values.roles.correlate.rules $ctx.Values.roles.quarantine.rules }}
            - {name: rules, mountPath: /etc/faultline/rules, readOnly: true}
            {{- end }}
            {{- if $sources }}
            - {name: secrets, mountPath: {{ include "faultline.secretDir" $ctx }}, readOnly: true}
            {{- end }}
            - {name: tmp, mountPath: /tmp}
      volumes:
        - name: config
          configMap:
            name: {{ $fn }}-config
        {{- if or $ctx.Values.roles.correlate.rules $ctx.Values.roles.quarantine.rules }}
        - name: rules
          configMap:
            name: {{ $fn }}-rules
        {{- end }}
        {{- if $sources }}
        - name: secrets
          projected:
            defaultMode: 0440
            sources:
              {{- $sources | nindent 14 }}
        {{- end }}
        - name: tmp
          emptyDir: {sizeLimit: 64Mi}
      {{- with $s.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $s.affinity }}
        {{- toYaml $s.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "faultline.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 20 }}
        {{- end }}
{{- if $s.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "faultline.labels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicas: {{ $s.autoscaling.minReplicas }}
  maxReplicas: {{ $s.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $s.autoscaling.targetCPUUtilizationPercentage }}
{{- end }}
{{- if $s.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "faultline.labels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
spec:
  maxUnavailable: {{ $s.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "faultline.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 6 }}
{{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "faultline.labels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
  {{- with .serviceAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ default "ClusterIP" .serviceType }}
  selector:
    {{- include "faultline.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
  ports:
    {{- range .ports }}
    - {name: {{ .name }}, port: {{ .containerPort }}, targetPort: {{ .name }}}
    {{- end }}
{{- end -}}
