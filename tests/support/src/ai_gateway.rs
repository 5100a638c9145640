//! Envoy AI Gateway's token limits as Envoy Gateway and AI Gateway write them for a real
//! Envoy, for `tests/full/ai_gateway.rs` (docs/ai-gateway-suite.md).
//!
//! Two paths. **Envoy Gateway's** (a `BackendTrafficPolicy` global rate limit whose rules
//! select `x-tenant-id` `Distinct`, take `limit.fromMetadata` and cost `request: 0`,
//! `response: Metadata`): its translator (`internal/xds/translator/ratelimit.go` in
//! envoyproxy/gateway) puts on the route, for filter `envoy.filters.http.ratelimit` and the
//! listener's name as domain, a request-time entry per rule (the route's generic key, the
//! header's `rule-<i>-match-0`, `hits_addend` number 0, the `limit` override from dynamic
//! metadata) and the same entry `apply_on_stream_done` with `hits_addend`
//! `%DYNAMIC_METADATA(<namespace>:<key>)%`; its xDS server sends the ratelimit service one
//! `RateLimitConfig` named and scoped by the listener: the route's key and value, under it
//! each rule's `rule-<i>-match-0` (a key, no value) with the static limit.
//! **AI Gateway's QuotaPolicy** (`internal/ratelimit/translator` and
//! `internal/extensionserver/quota_ratelimit.go` in envoyproxy/ai-gateway): domain
//! `ai-gateway-quota`, `backend_name` then `model_name_override` in `quota_mode`, a filter
//! `envoy.filters.http.ratelimit/ai-gateway-quota` of its own, a request-time entry of two
//! generic keys (one hit) and a stream-done entry reading both from dynamic metadata with
//! `hits_addend` `%DYNAMIC_METADATA(io.envoy.ai_gateway:quota_cost)%`.
//!
//! What Kubernetes would run is stood in for by Lua filters of the same Envoy: the ext_authz
//! server that writes per-tier budgets into `envoy.filters.http.ext_authz`'s metadata, and
//! AI Gateway's ext_proc, which routes on the body's model (`x-ai-eg-model`) and writes the
//! response's usage into `io.envoy.ai_gateway`'s (`llm_*_token`, the example's CEL cost,
//! `quota_cost`, the backend and model names). The backend is a listener of the same Envoy
//! on a Unix socket answering with the body the client put in `x-test-response-body`, as
//! AI Gateway's testupstream does with its header (there base64).

use std::path::Path;

use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitConfig, RateLimitUnit};
use serde_yaml_ng::Value;

use crate::ads::entry;
use crate::envoy::{admin, backend_cluster, yaml};

/// Where Envoy files ext_authz's dynamic metadata.
pub const EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
/// AI Gateway's dynamic metadata namespace (`aigv1b1.AIGatewayFilterMetadataNamespace`).
pub const AI_GATEWAY: &str = "io.envoy.ai_gateway";
/// AI Gateway's quota domain (`translator.QuotaDomain`).
pub const QUOTA_DOMAIN: &str = "ai-gateway-quota";
/// The node AI Gateway's controller serves the quota ratelimit as (`runner.NodeID`).
pub const QUOTA_NODE: &str = "envoy-ai-gateway-ratelimit";
/// The client header the rendered request body travels in to the stand-in backend.
pub const RESPONSE_BODY: &str = "x-test-response-body";

/// One rule of a `BackendTrafficPolicy` global rate limit: `x-tenant-id` `Distinct`, a
/// static limit per hour, optionally `fromMetadata` (ext_authz's namespace, `limit_key`),
/// cost `request: {from: Number, number: 0}`, `response: {from: Metadata,
/// metadata: {namespace: io.envoy.ai_gateway, key: cost_key}}`.
#[derive(Clone, Copy)]
pub struct Rule {
    pub requests: u32,
    pub limit_key: Option<&'static str>,
    pub cost_key: &'static str,
}

/// A Gateway `name` in namespace `default` with one HTTP listener `http`, an AIGatewayRoute
/// `route` matching model `model`, and a `BackendTrafficPolicy` of `rules` targeting it.
pub struct Gateway {
    pub name: &'static str,
    pub route: &'static str,
    pub model: &'static str,
    pub rules: Vec<Rule>,
}

impl Gateway {
    /// Envoy Gateway's IR listener name: the domain of the listener's rate limits.
    pub fn listener(&self) -> String {
        format!("default/{}/http", self.name)
    }

    /// Envoy Gateway's IR route name for the AIGatewayRoute's generated HTTPRoute (rule 0,
    /// match 0, any host): the route's descriptor key and value.
    pub fn route_name(&self) -> String {
        format!("httproute/default/{}/rule/0/match/0/*", self.route)
    }

    /// What Envoy Gateway's xDS server sends the ratelimit service
    /// (`BuildRateLimitServiceConfig`): one config named and scoped by the listener.
    pub fn service_config(&self) -> RateLimitConfig {
        let route = self.route_name();
        let rules = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let key = format!("rule-{i}-match-0");
                entry(&key, "", Some((r.requests, RateLimitUnit::Hour)), vec![])
            })
            .collect();
        RateLimitConfig {
            name: self.listener(),
            domain: self.listener(),
            descriptors: vec![entry(&route, &route, None, rules)],
        }
    }

    /// The route's `typed_per_filter_config` as Envoy Gateway's `buildRouteRateLimits`
    /// writes it: per rule the request-time entry, then its stream-done twin.
    pub fn route_rate_limits(&self) -> Value {
        let route = self.route_name();
        let mut limits = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let override_ = rule.limit_key.map_or(String::new(), |key| {
                format!(
                    "limit: {{dynamic_metadata: {{metadata_key: {{key: {EXT_AUTHZ}, path: [{{key: {key}}}]}}}}}}"
                )
            });
            let actions = format!(
                r#"actions:
  - generic_key: {{descriptor_key: "{route}", descriptor_value: "{route}"}}
  - request_headers: {{header_name: x-tenant-id, descriptor_key: rule-{i}-match-0}}
{override_}"#
            );
            let mut request = yaml(&actions);
            request["hits_addend"] = yaml("{number: 0}");
            let mut done = yaml(&actions);
            done["apply_on_stream_done"] = Value::Bool(true);
            done["hits_addend"] = yaml(&format!(
                r#"{{format: "%DYNAMIC_METADATA({AI_GATEWAY}:{})%"}}"#,
                rule.cost_key
            ));
            limits.push(request);
            limits.push(done);
        }
        let mut per_route = yaml(
            r#"{"@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute}"#,
        );
        per_route["domain"] = Value::from(self.listener());
        per_route["rate_limits"] = Value::Sequence(limits);
        let mut config = Value::Mapping(Default::default());
        config["envoy.filters.http.ratelimit"] = per_route;
        config
    }

    /// Envoy Gateway's rate-limit filter (`createRateLimitFilter`): the listener's domain,
    /// cluster `ratelimit_cluster`, draft-03 headers, no `x-envoy-ratelimited`. The timeout
    /// is `rateLimit.timeout` of Envoy Gateway's configuration, set here to 1 s (unset,
    /// Envoy's 20 ms applies) so that a slow debug build under load is not let through.
    pub fn rate_limit_filter(&self) -> Value {
        let mut filter = rate_limit_filter("envoy.filters.http.ratelimit", "ratelimit_cluster");
        filter["typed_config"]["domain"] = Value::from(self.listener());
        filter
    }
}

fn rate_limit_filter(name: &str, cluster: &str) -> Value {
    let mut filter = yaml(
        r#"
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
  timeout: 1s
  failure_mode_deny: false
  disable_x_envoy_ratelimited_header: true
  enable_x_ratelimit_headers: DRAFT_VERSION_03
  rate_limit_service:
    transport_api_version: V3
    grpc_service: {envoy_grpc: {}}
"#,
    );
    filter["name"] = Value::from(name);
    filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] =
        Value::from(cluster);
    filter
}

/// AI Gateway's QuotaPolicy with one per-model quota and no bucket rules, on
/// AIServiceBackend `default/<backend>`.
pub struct Quota {
    pub backend: &'static str,
    pub model: &'static str,
    pub limit: u32,
}

impl Quota {
    fn backend_name(&self) -> String {
        format!("default/{}", self.backend)
    }

    /// The one `RateLimitConfig` AI Gateway's controller serves (`BuildRateLimitConfigs`,
    /// merged): `backend_name`, then `model_name_override` with the default bucket in
    /// quota mode.
    pub fn service_config(&self) -> RateLimitConfig {
        let mut model = entry(
            "model_name_override",
            self.model,
            Some((self.limit, RateLimitUnit::Hour)),
            vec![],
        );
        model.quota_mode = true;
        RateLimitConfig {
            name: QUOTA_DOMAIN.to_string(),
            domain: QUOTA_DOMAIN.to_string(),
            descriptors: vec![entry(
                "backend_name",
                &self.backend_name(),
                None,
                vec![model],
            )],
        }
    }

    /// The route's `typed_per_filter_config` (`enableQuotaRateLimitOnRoute`, the simple
    /// case): two generic keys at request time (one hit), the same two read from AI
    /// Gateway's metadata at stream done with `quota_cost` as the hits.
    pub fn route_rate_limits(&self) -> Value {
        let per_route = format!(
            r#"
"@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
domain: {QUOTA_DOMAIN}
rate_limits:
  - actions:
      - generic_key: {{descriptor_key: backend_name, descriptor_value: "{backend}"}}
      - generic_key: {{descriptor_key: model_name_override, descriptor_value: "{model}"}}
  - actions:
      - metadata:
          descriptor_key: backend_name
          metadata_key: {{key: {AI_GATEWAY}, path: [{{key: ai_service_backend_name}}]}}
          source: DYNAMIC
      - metadata:
          descriptor_key: model_name_override
          metadata_key: {{key: {AI_GATEWAY}, path: [{{key: model_name_override}}]}}
          source: DYNAMIC
    hits_addend: {{format: "%DYNAMIC_METADATA({AI_GATEWAY}:quota_cost)%"}}
    apply_on_stream_done: true
"#,
            backend = self.backend_name(),
            model = self.model,
        );
        let mut config = Value::Mapping(Default::default());
        config["envoy.filters.http.ratelimit/ai-gateway-quota"] = yaml(&per_route);
        config
    }

    /// AI Gateway's quota filter (`buildQuotaRateLimitFilter`, its defaults but the 5 s
    /// timeout, 1 s here).
    pub fn rate_limit_filter(&self) -> Value {
        let mut filter = rate_limit_filter(
            "envoy.filters.http.ratelimit/ai-gateway-quota",
            "ai_gateway_ratelimit_cluster",
        );
        filter["typed_config"]["domain"] = Value::from(QUOTA_DOMAIN);
        filter
    }
}

/// Budgets per tier: each tier's (metadata key, requests per hour).
pub type Tiers<'a> = &'a [(&'a str, &'a [(&'a str, u32)])];

/// The ext_authz stand-in: for the `x-tenant-tier` named in `tiers`, each of its budgets
/// (key, requests per hour) written into ext_authz's namespace as the
/// `{requests_per_unit, unit}` struct Envoy's limit override reads; nothing for another
/// tier (ext-auth server's `EXT_AUTH_DYNAMIC_METADATA_BY_HEADER`).
pub fn ext_authz_filter(tiers: Tiers<'_>) -> Value {
    let mut table = String::new();
    for (tier, budgets) in tiers {
        table.push_str(&format!("  [\"{tier}\"] = {{\n"));
        for (key, n) in *budgets {
            table.push_str(&format!(
                "    [\"{key}\"] = {{requests_per_unit = {n}, unit = \"HOUR\"}},\n"
            ));
        }
        table.push_str("  },\n");
    }
    let code = format!(
        r#"local budgets = {{
{table}}}
function envoy_on_request(handle)
  local tier = handle:headers():get("x-tenant-tier")
  local found = tier and budgets[tier]
  if found == nil then return end
  for key, budget in pairs(found) do
    handle:streamInfo():dynamicMetadata():set("{EXT_AUTHZ}", key, budget)
  end
end
"#
    );
    lua("ext-authz-stand-in", &code)
}

/// AI Gateway's ext_proc stand-in. Request: the body's `model` into `x-ai-eg-model`, the
/// route chosen again. Response (from the backend, 200): the OpenAI usage read from the
/// body into AI Gateway's namespace, as its `llmRequestCosts` and a QuotaPolicy's
/// `quota_cost` (default CEL `total_tokens`) write it, with the model and the backend's
/// short name (`ai_service_backend_name`).
pub fn ext_proc_filter(backend: &str) -> Value {
    let code = format!(
        r#"local function usage(text, name)
  return tonumber(string.match(text, '"' .. name .. '"%s*:%s*(%d+)')) or 0
end
function envoy_on_request(handle)
  local body = handle:body()
  if body == nil then return end
  local model = string.match(body:getBytes(0, body:length()), '"model"%s*:%s*"([^"]*)"')
  if model == nil then return end
  handle:headers():replace("x-ai-eg-model", model)
  handle:streamInfo():dynamicMetadata():set("envoy.filters.http.lua", "model", model)
  handle:clearRouteCache()
end
function envoy_on_response(handle)
  if handle:headers():get(":status") ~= "200" then return end
  local body = handle:body()
  local text = body and body:getBytes(0, body:length()) or ""
  local input, output = usage(text, "prompt_tokens"), usage(text, "completion_tokens")
  local total, cached = usage(text, "total_tokens"), usage(text, "cached_tokens")
  local mine = handle:streamInfo():dynamicMetadata():get("envoy.filters.http.lua") or {{}}
  local costs = {{
    llm_input_token = input,
    llm_cached_input_token = cached,
    llm_cache_creation_input_token = 0,
    llm_output_token = output,
    llm_total_token = total,
    -- the token_ratelimit example's CEL: input_tokens == uint(3) ? 100000000 : 0
    llm_cel_calculated_token = (input == 3) and 100000000 or 0,
    quota_cost = total,
    model_name_override = mine["model"],
    ai_service_backend_name = "default/{backend}",
  }}
  for key, value in pairs(costs) do
    handle:streamInfo():dynamicMetadata():set("{AI_GATEWAY}", key, value)
  end
end
"#
    );
    lua("ext-proc-stand-in", &code)
}

fn lua(name: &str, code: &str) -> Value {
    let mut filter = yaml(
        r#"
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
  default_source_code: {}
"#,
    );
    filter["name"] = Value::from(format!("envoy.filters.http.lua/{name}"));
    filter["typed_config"]["default_source_code"]["inline_string"] = Value::from(code);
    filter
}

/// The stand-in backend: a listener on the Unix socket `path` answering 200 with the body
/// the client sent in [`RESPONSE_BODY`] (AI Gateway's testupstream, without base64).
fn backend_listener(path: &Path) -> Value {
    let code = format!(
        r#"function envoy_on_request(handle)
  local body = handle:headers():get("{RESPONSE_BODY}") or "{{}}"
  handle:respond({{[":status"] = "200", ["content-type"] = "application/json"}}, body)
end
"#
    );
    // Envoy's backend listener, its Lua answering before its route is reached.
    let mut listener = crate::envoy::backend_listener(path);
    listener["name"] = Value::from("testupstream");
    let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_sequence_mut()
        .unwrap();
    filters.insert(0, lua("testupstream", &code));
    listener
}

/// A gRPC (HTTP/2) cluster `name` at `addr` (a ratelimit).
pub fn grpc_cluster(name: &str, addr: &str) -> Value {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut cluster = yaml(
        r#"
type: STATIC
connect_timeout: 1s
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http2_protocol_options: {}}
load_assignment:
  endpoints:
    - lb_endpoints:
        - endpoint: {address: {socket_address: {}}}
"#,
    );
    cluster["name"] = Value::from(name);
    cluster["load_assignment"]["cluster_name"] = Value::from(name);
    let socket = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"];
    socket["address"] = Value::from(host);
    socket["port_value"] = Value::from(port.parse::<u16>().unwrap());
    cluster
}

/// A whole Envoy: listener `listener` on 127.0.0.1 port 0 with the ext_authz stand-in
/// (`ext_authz`, when given), AI Gateway's ext_proc stand-in, `rate_limit_filters` and the
/// router, in Envoy Gateway's order; one route for `model` to the stand-in backend (a
/// Unix socket in `dir`) carrying `per_route`; and `clusters` (the ratelimits').
pub struct Envoy<'a> {
    pub listener: String,
    pub model: &'a str,
    pub backend: &'a str,
    pub ext_authz: Option<Value>,
    pub rate_limit_filters: Vec<Value>,
    pub per_route: Value,
    pub clusters: Vec<Value>,
}

impl Envoy<'_> {
    pub fn config(self, dir: &Path) -> Value {
        let socket = dir.join("testupstream.sock");
        let mut filters: Vec<Value> = self.ext_authz.into_iter().collect();
        filters.push(ext_proc_filter(self.backend));
        filters.extend(self.rate_limit_filters);
        filters.push(yaml(
            r#"{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router, suppress_envoy_headers: true}}"#,
        ));
        let mut listener = yaml(
            r#"
address: {socket_address: {address: 127.0.0.1, port_value: 0}}
filter_chains:
  - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: http-80
          route_config:
            virtual_hosts:
              - name: gateway
                domains: ["*"]
                routes:
                  - match:
                      prefix: "/"
                      headers: [{name: x-ai-eg-model, string_match: {}}]
                    route: {cluster: testupstream}
"#,
        );
        listener["name"] = Value::from(self.listener.as_str());
        let hcm = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
        hcm["http_filters"] = Value::Sequence(filters);
        hcm["route_config"]["name"] = Value::from(self.listener.as_str());
        let route = &mut hcm["route_config"]["virtual_hosts"][0]["routes"][0];
        route["match"]["headers"][0]["string_match"]["exact"] = Value::from(self.model);
        route["typed_per_filter_config"] = self.per_route;
        let mut clusters = self.clusters;
        clusters.push(backend_cluster("testupstream", &socket));
        let mut config = Value::Mapping(Default::default());
        config["admin"] = admin();
        config["static_resources"]["listeners"] =
            Value::Sequence(vec![listener, backend_listener(&socket)]);
        config["static_resources"]["clusters"] = Value::Sequence(clusters);
        config
    }
}

/// The OpenAI chat completion the stand-in backend answers with: its `usage` of `input`,
/// `output` and `total` tokens, and `prompt_tokens_details.cached_tokens` when given
/// (the test's fake response bodies).
pub fn completion(input: u64, output: u64, total: u64, cached: Option<u64>) -> String {
    let details = cached.map_or(String::new(), |c| {
        format!(r#","prompt_tokens_details":{{"cached_tokens":{c}}}"#)
    });
    format!(
        r#"{{"choices":[{{"message":{{"content":"This is a test.","role":"assistant"}}}}],"usage":{{"prompt_tokens":{input},"completion_tokens":{output},"total_tokens":{total}{details}}}}}"#
    )
}

/// The request body AI Gateway's tests send.
pub fn chat_request(model: &str) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"Say this is a test"}}],"model":"{model}"}}"#
    )
}
