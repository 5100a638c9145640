//! envoyproxy/ratelimit's own integration suite (its `test/integration/*.go`), re-expressed
//! against cellrate run as `ratelimit`: its environment (settings as variables), its
//! runtime layout and files, real Redis servers started as its Makefile starts them, a
//! real gRPC client over loopback, whole responses compared with `==` as its
//! `common.AssertProtoEqual` compares them with `proto.Equal`, and its statistics read
//! after every request as it reads its stats store (here from the Prometheus listener,
//! `cellrate_ratelimit_hits_total{key,stat}`). Every Go test and `t.Run` case, with its
//! status here (passes, pending a feature, cannot pass and why) and the count of
//! assertions that hold, is in docs/upstream-suite.md.

mod base;
mod extra_tags;
mod grpc_certs;
mod memcache;
mod mtls;
mod redis;
mod reload;
mod xds;
