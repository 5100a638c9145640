{{- define "cellrate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cellrate.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cellrate.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cellrate.configMapName" -}}
{{- default (include "cellrate.fullname" .) .Values.config.existingConfigMap -}}
{{- end -}}

{{/*
How many replicas may run at once: 1 with autoscaling off and one replica, else more.
With the memory store every replica admits every limit on its own, so more than one is
refused unless memoryStore.independentReplicas opts in.
*/}}
{{- define "cellrate.severalReplicas" -}}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) -}}true{{- end -}}
{{- end -}}

{{- define "cellrate.checkReplicas" -}}
{{- if and (include "cellrate.severalReplicas" .) (not .Values.redis.enabled) (not .Values.memoryStore.independentReplicas) -}}
{{- fail "cellrate: several replicas on the memory store would each admit every limit on its own (N replicas = N times the limits). Enable redis (shared buckets), or set replicaCount: 1 and autoscaling.enabled: false, or opt in with memoryStore.independentReplicas: true." -}}
{{- end -}}
{{- if and .Values.redis.enabled (not .Values.redis.existingSecret) (not .Values.redis.sentinel.nodes) -}}
{{- fail "cellrate: redis.enabled needs redis.existingSecret, the Secret holding the Redis URL (or cluster nodes), or redis.sentinel.nodes." -}}
{{- end -}}
{{- if and .Values.redis.sentinel.nodes (not .Values.redis.sentinel.masterName) -}}
{{- fail "cellrate: redis.sentinel.nodes needs redis.sentinel.masterName, the master's name in the sentinels' configuration." -}}
{{- end -}}
{{- if and .Values.redis.sentinel.nodes .Values.redis.cluster -}}
{{- fail "cellrate: redis.sentinel and redis.cluster exclude each other." -}}
{{- end -}}
{{- if and .Values.redis.sentinel.passwordKey (not .Values.redis.existingSecret) -}}
{{- fail "cellrate: redis.sentinel.passwordKey names a key in redis.existingSecret, which is not set." -}}
{{- end -}}
{{- if and .Values.redis.tls.existingSecret .Values.redis.sentinel.nodes -}}
{{- fail "cellrate: redis.tls (a private CA, client certificates) is not served with redis.sentinel: give the master and the sentinels certificates from a public CA." -}}
{{- end -}}
{{- if and .Values.redis.tls.existingSecret (not .Values.redis.tls.caKey) (not (and .Values.redis.tls.certKey .Values.redis.tls.keyKey)) -}}
{{- fail "cellrate: redis.tls.existingSecret needs caKey, or certKey and keyKey." -}}
{{- end -}}
{{- if and .Values.service.exposeAdmin (not .Values.adminToken.existingSecret) -}}
{{- fail "cellrate: service.exposeAdmin puts the admin RPCs (Reset, SetOverride, ...) on the pod IP and in the Service; without a token anyone who reaches the port may reset buckets and lift limits. Create a Secret with a token (kubectl create secret generic cellrate-admin --from-literal=token=\"$(openssl rand -hex 32)\") and set adminToken.existingSecret=cellrate-admin. For TLS: the chart does not turn on cellrate's own (--tls-cert/--tls-key would cover both gRPC listeners, and the chart's gRPC readiness probe speaks plaintext): encrypt the admin traffic with your mesh's mTLS (Istio: the port is named grpc-admin), or keep exposeAdmin false and use kubectl port-forward." -}}
{{- end -}}
{{- if and .Values.redis.enabled (eq .Values.redis.failurePolicy "local") (ne (int .Values.redis.localDivisor) 0) (ne (int .Values.redis.localDivisor) (int (include "cellrate.localDivisor" .))) -}}
{{- fail (printf "cellrate: redis.localDivisor is %d, but %s: with failurePolicy local each replica would admit 1/%d of every limit while Redis fails, %s. Leave redis.localDivisor at 0 (the chart derives it) or set it to %s." (int .Values.redis.localDivisor) (ternary (printf "autoscaling may run up to %d replicas (autoscaling.maxReplicas)" (int .Values.autoscaling.maxReplicas)) (printf "replicaCount is %d" (int .Values.replicaCount)) .Values.autoscaling.enabled) (int .Values.redis.localDivisor) (ternary "so the replicas together would admit more than the limits" "so the replicas together would admit less than the limits" (lt (int .Values.redis.localDivisor) (int (include "cellrate.localDivisor" .)))) (include "cellrate.localDivisor" .)) -}}
{{- end -}}
{{- if .Values.memoryStore.snapshot.enabled -}}
{{- if .Values.redis.enabled -}}
{{- fail "cellrate: memoryStore.snapshot keeps the memory store's buckets; with redis.enabled they live in Redis. Turn one off." -}}
{{- end -}}
{{- if include "cellrate.severalReplicas" . -}}
{{- fail "cellrate: memoryStore.snapshot keeps one replica's buckets in one file; several replicas would overwrite one another's. Run one replica (replicaCount: 1, autoscaling.enabled: false)." -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The failure policy local's divisor: each replica admits 1/divisor of every limit while Redis
fails, so the replicas together admit at most the limit. The replica count, or with
autoscaling its maximum (fewer replicas then admit less than the limit, never more).
*/}}
{{- define "cellrate.localDivisor" -}}
{{- if .Values.autoscaling.enabled -}}{{ int .Values.autoscaling.maxReplicas }}{{- else -}}{{ int .Values.replicaCount }}{{- end -}}
{{- end -}}
