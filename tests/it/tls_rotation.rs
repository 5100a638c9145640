//! The gRPC listener's certificate is re-read when its files change, Kubernetes' way (a
//! Secret's `..data` symlink swapped to a new directory): new connections get the new
//! certificate, connections already open keep working; a bad new file (unparsable, a key
//! that does not match, too large) keeps the old certificate in force, logged and counted.
//! Through the real binary, with `--reload-interval-seconds 3600`: only the watch can see
//! the swaps in time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::pki::Pki;
use crate::common::{http_get, item, sample, serve_with, Process};
use cellrate::proto::v1 as pb;
use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

/// Puts `files` in a new directory `name` under `dir` and points `..data` at it, as the
/// kubelet updates a mounted Secret (a symlink renamed over the old one).
fn swap(dir: &Path, name: &str, files: &[(&str, &[u8])]) {
    std::fs::create_dir(dir.join(name)).unwrap();
    for (file, bytes) in files {
        std::fs::write(dir.join(name).join(file), bytes).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(name, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// The leaf certificate a new TLS connection to `addr` is shown (trusting every CA in
/// `cas`).
async fn peer_cert(addr: &str, cas: &[&str]) -> Vec<u8> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
            .unwrap();
    }
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Polls (every 50 ms, at most 10 s) until `done`.
async fn within_10s(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn reloads(process: &Process, result: &str) -> f64 {
    let (_, text) = http_get(&process.metrics, "/metrics");
    let series = format!("cellrate_tls_reloads_total{{result=\"{result}\"}}");
    sample(&text, &series).unwrap_or(-1.0)
}

/// The next log line (JSON) saying that the TLS files were rejected, within 10 s.
fn rejection_logged(process: &Process) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(line) = process
        .logs
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        if line.contains("TLS files rejected") {
            return line;
        }
    }
    panic!("no log line for the rejected TLS files within 10 s");
}

async fn check(client: &mut pb::rate_limiter_client::RateLimiterClient<Channel>) -> bool {
    let request = pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "rotation", Some(0))],
        ..Default::default()
    };
    client.check(request).await.is_ok()
}

#[tokio::test]
async fn a_swapped_certificate_serves_new_connections_and_a_bad_one_is_refused() {
    let (a, b, c) = (Pki::new(), Pki::new(), Pki::new());
    let cas = [a.ca.as_str(), b.ca.as_str(), c.ca.as_str()];
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ac, ak) = (a.server_cert.as_bytes(), a.server_key.as_bytes());
    swap(d, "..a", &[("tls.crt", ac), ("tls.key", ak)]);
    for name in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(Path::new("..data").join(name), d.join(name)).unwrap();
    }
    let (cert, key) = (d.join("tls.crt"), d.join("tls.key"));
    let flags = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let config = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));
    let process = serve_with(
        config,
        &[&flags[..], &["--reload-interval-seconds", "3600"]].concat(),
    );
    let addr = process.listen.clone();
    assert_eq!(peer_cert(&addr, &cas).await, der(&a.server_cert));

    // A connection opened under the old certificate.
    let tls = ClientTlsConfig::new()
        .ca_certificates(cas.iter().map(Certificate::from_pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap();
    let mut old = pb::rate_limiter_client::RateLimiterClient::new(channel.connect().await.unwrap());
    assert!(check(&mut old).await);

    let (bc, bk) = (b.server_cert.as_bytes(), b.server_key.as_bytes());
    swap(d, "..b", &[("tls.crt", bc), ("tls.key", bk)]);
    within_10s("the new certificate", async || {
        peer_cert(&addr, &cas).await == der(&b.server_cert)
    })
    .await;
    assert_eq!(reloads(&process, "success"), 1.0);
    assert!(
        check(&mut old).await,
        "the connection opened before the swap still works"
    );

    // Bad files: each rejected, counted and logged; the certificate in force stays.
    let padded = format!("{}{}", c.server_cert, "# padding\n".repeat(120_000));
    let bad: [(&str, Vec<u8>, Vec<u8>); 3] = [
        (
            "unparsable",
            b"not a certificate".to_vec(),
            c.server_key.clone().into_bytes(),
        ),
        (
            "key of another certificate",
            c.server_cert.clone().into_bytes(),
            bk.to_vec(),
        ),
        (
            "over 1 MiB",
            padded.into_bytes(),
            c.server_key.clone().into_bytes(),
        ),
    ];
    for (n, (what, cert, key)) in bad.iter().enumerate() {
        swap(
            d,
            &format!("..bad{n}"),
            &[("tls.crt", cert), ("tls.key", key)],
        );
        let failures = (n + 1) as f64;
        within_10s(what, async || reloads(&process, "failure") == failures).await;
        let line = rejection_logged(&process);
        assert!(
            line.contains("certificate in force stays"),
            "{what}: {line}"
        );
        assert_eq!(peer_cert(&addr, &cas).await, der(&b.server_cert), "{what}");
    }
    assert_eq!(reloads(&process, "success"), 1.0);
    assert!(check(&mut old).await);
}

/// A FIFO where a TLS file should be: opening it waited for a writer for ever, so at start
/// the process hung before serving, and in a rotation the re-read hung (no failure
/// counted, no later rotation) and SIGTERM no longer ended the process. Now the FIFO is
/// refused without opening it: startup stops naming it (here), a rotation to it is a
/// rejected reload (the certificate in force stays), and SIGTERM ends the process (below).
#[tokio::test]
async fn a_fifo_at_a_tls_path_is_refused_without_waiting_for_a_writer() {
    let a = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo.key");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success(), "mkfifo");
    let cert = d.join("plain.crt");
    std::fs::write(&cert, &a.server_cert).unwrap();
    let config = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));

    // At start: --tls-key, then --client-ca, a FIFO.
    let key = d.join("plain.key");
    std::fs::write(&key, &a.server_key).unwrap();
    let (c, f, k) = (
        cert.to_str().unwrap(),
        fifo.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let starts: [&[&str]; 2] = [
        &["--tls-cert", c, "--tls-key", f],
        &["--tls-cert", c, "--tls-key", k, "--client-ca", f],
    ];
    for flags in starts {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cellrate"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--metrics-listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .args(flags)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{flags:?}: still starting after 20 s (waiting on the FIFO)");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{flags:?}: {status}");
        assert!(stderr.contains("FIFO"), "{flags:?}: {stderr}");
    }
}

/// The rotation half of the above: the key swapped for a FIFO is a rejected reload, and
/// SIGTERM still ends the process.
#[tokio::test]
async fn a_fifo_swapped_in_for_a_tls_key_is_a_rejected_reload() {
    let a = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo.key");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success(), "mkfifo");
    let config = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));
    let (ac, ak) = (a.server_cert.as_bytes(), a.server_key.as_bytes());
    swap(d, "..a", &[("tls.crt", ac), ("tls.key", ak)]);
    for name in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(Path::new("..data").join(name), d.join(name)).unwrap();
    }
    let (cert, key) = (d.join("tls.crt"), d.join("tls.key"));
    let flags = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--reload-interval-seconds",
        "3600",
    ];
    let process = serve_with(config, &flags);
    let addr = process.listen.clone();
    assert_eq!(peer_cert(&addr, &[&a.ca]).await, der(&a.server_cert));
    std::fs::create_dir(d.join("..fifo")).unwrap();
    std::fs::write(d.join("..fifo/tls.crt"), ac).unwrap();
    std::fs::rename(&fifo, d.join("..fifo/tls.key")).unwrap();
    let tmp = d.join("..data_tmp");
    std::os::unix::fs::symlink("..fifo", &tmp).unwrap();
    std::fs::rename(&tmp, d.join("..data")).unwrap();
    within_10s("the FIFO rejected", async || {
        reloads(&process, "failure") == 1.0
    })
    .await;
    let line = rejection_logged(&process);
    assert!(line.contains("FIFO"), "{line}");
    assert_eq!(peer_cert(&addr, &[&a.ca]).await, der(&a.server_cert));
    tokio::task::spawn_blocking(move || crate::process_ops::terminate(process))
        .await
        .unwrap();
}
