//! Upstream's Test_mTLS: the gRPC listener with TLS (GRPC_SERVER_USE_TLS, a server
//! certificate of one CA) requiring client certificates of another (GRPC_CLIENT_TLS_CACERT,
//! GRPC_CLIENT_TLS_SAN=localhost), over a TLS Redis asking for a password. Upstream's only
//! assertion is that `grpc.Dial` with the client's certificate returns no error (a lazy
//! dial); here the handshake and a ShouldRateLimit answer are what holds, and a client
//! without a certificate is refused, and so is one whose certificate the client CA signed
//! for another name than GRPC_CLIENT_TLS_SAN's (as upstream's `verifyClient` refuses it).

use super::base::{response, start_all, upstream_runtime, Variant};
use crate::common::pki::Pki;
use crate::common::ratelimit_answers::request;
use crate::common::redis_server::RedisServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

#[tokio::test]
async fn test_mtls() {
    let dir = tempfile::tempdir().unwrap();
    crate::redis_tls::upstream_self_signed(dir.path(), "redis");
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (redis_cert, redis_key) = (path("redis.pem"), path("redis.key"));
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let _redis = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &redis_cert,
        "--tls-key-file",
        &redis_key,
        "--tls-ca-cert-file",
        &redis_cert,
        "--tls-auth-clients",
        "no",
        "--requirepass",
        "password123",
    ]);
    // Upstream's mTLSSetup twice: a server CA and a client CA, each with a leaf for
    // localhost.
    let (server, client) = (Pki::new(), Pki::new());
    for (name, text) in [
        ("server.pem", &server.server_cert),
        ("server.key", &server.server_key),
        ("client-ca.pem", &client.ca),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let url = format!("localhost:{tls_port}");
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_AUTH", "password123"),
        ("REDIS_PERSECOND_AUTH", "password123"),
        ("REDIS_PERSECOND_TLS", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false"),
        ("REDIS_TLS_CACERT", redis_cert.as_str()),
        ("GRPC_SERVER_USE_TLS", "true"),
    ];
    let files = [
        ("GRPC_SERVER_TLS_CERT", path("server.pem")),
        ("GRPC_SERVER_TLS_KEY", path("server.key")),
        ("GRPC_CLIENT_TLS_CACERT", path("client-ca.pem")),
        ("GRPC_CLIENT_TLS_SAN", "localhost".to_string()),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let variant = Variant::new("Test_mTLS", &vars, &files);
    let root = upstream_runtime();
    let started = start_all(root.path(), &[], &[variant]);
    let addr = &started[0].serving.listen;

    let tls = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&server.ca))
            .domain_name("localhost")
    };
    let with_cert = tls().identity(Identity::from_pem(&client.server_cert, &client.server_key));
    let channel = connect(addr, with_cert).await.expect("the mTLS handshake");
    let mut c = RateLimitServiceClient::new(channel);
    let r = c
        .should_rate_limit(request("foo", &[&[("hello", "world")]]))
        .await;
    let unknown = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(r.unwrap().into_inner(), response(Code::Ok, vec![unknown]));

    // Without a client certificate: no answer.
    let refused = match connect(addr, tls()).await {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request("foo", &[&[("hello", "world")]]))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was answered");

    // A certificate of the same client CA, for `operator` rather than `localhost`: signed
    // by the CA the listener trusts, but not bearing GRPC_CLIENT_TLS_SAN's name.
    let other_name = tls().identity(Identity::from_pem(&client.client_cert, &client.client_key));
    let refused = match connect(addr, other_name).await {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request("foo", &[&[("hello", "world")]]))
            .await
            .is_err(),
    };
    assert!(
        refused,
        "a client certificate without GRPC_CLIENT_TLS_SAN's name was answered"
    );
}

async fn connect(addr: &str, config: ClientTlsConfig) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
}
