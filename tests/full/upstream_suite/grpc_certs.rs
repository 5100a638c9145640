//! Upstream's TestReloadGRPCServerCerts: `ratelimit` with GRPC_SERVER_USE_TLS, its server
//! certificate and key files of one CA (upstream's `mTLSSetup`: a CA and a certificate
//! for `localhost`, written to files side by side in one directory), a second CA's
//! certificate and key beside them; a TLS dial (no client certificate, no ALPN, as Go's
//! `tls.Dial`) trusting the first CA succeeds and one trusting the second fails; the second
//! certificate, then its key, are renamed over the files in force; within 10 s a dial
//! trusting the second CA succeeds, and then one trusting the first fails. Upstream dials
//! once a second; here every 50 ms, within the same 10 s.

use super::base::{start_all, upstream_runtime, Variant};
use crate::common::pki::Pki;
use crate::common::redis_server::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// Go's `tls.Dial("tcp", "localhost:<port>", &tls.Config{RootCAs: <ca>})`: the handshake,
/// its server certificate checked against `ca` for `localhost`; Ok when it completes.
async fn tls_dial(addr: &str, ca: &str) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let handshake = connector.connect(name, tcp);
    match tokio::time::timeout(Duration::from_secs(5), handshake).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no handshake within 5 s".into()),
    }
}

#[tokio::test]
async fn test_reload_grpc_server_certs() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (initial, new) = (Pki::new(), Pki::new());
    for (name, text) in [
        ("initial-cert.pem", &initial.server_cert),
        ("initial-key.pem", &initial.server_key),
        ("new-cert.pem", &new.server_cert),
        ("new-key.pem", &new.server_key),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let url = format!("127.0.0.1:{}", redis.port);
    let (cert, key) = (path("initial-cert.pem"), path("initial-key.pem"));
    let vars = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
    ];
    let variant = Variant::new("TestReloadGRPCServerCerts", &vars, &[]);
    let root = upstream_runtime();
    let started = start_all(root.path(), &[], &[variant]);
    let addr = started[0].serving.listen.as_str();

    // WithInitialCert, WithNewCertFail.
    let dial = tls_dial(addr, &initial.ca).await;
    assert_eq!(dial, Ok(()), "WithInitialCert");
    let dial = tls_dial(addr, &new.ca).await;
    assert!(dial.is_err(), "WithNewCertFail: {dial:?}");

    std::fs::rename(path("new-cert.pem"), &cert).unwrap();
    std::fs::rename(path("new-key.pem"), &key).unwrap();

    // WithNewCertOK: within 10 s.
    let start = Instant::now();
    let mut dial = tls_dial(addr, &new.ca).await;
    while dial.is_err() && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        dial = tls_dial(addr, &new.ca).await;
    }
    assert_eq!(dial, Ok(()), "WithNewCertOK after {:?}", start.elapsed());
    // WithInitialCertFail.
    let dial = tls_dial(addr, &initial.ca).await;
    assert!(dial.is_err(), "WithInitialCertFail: {dial:?}");
}
