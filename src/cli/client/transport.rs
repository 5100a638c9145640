//! Reaching the server: a channel (TLS when a CA is given), one call within the client's
//! deadline, the admin token on admin calls, and a hint for the commonest mistake.

use std::future::Future;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{Exit, Failed};
use crate::cli::ClientArgs;
use crate::proto::v1 as pb;

type AdminClient = pb::admin_client::AdminClient<Channel>;

pub(super) fn block_on<T>(
    client: &ClientArgs,
    work: impl std::future::Future<Output = Result<T, Failed>>,
) -> Result<T, Failed> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failed(Exit::Failure, format!("cannot start the runtime: {e}")))?;
    let limit = Duration::from_secs(client.timeout_seconds.max(1));
    runtime.block_on(async {
        tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
            Err(Failed(
                Exit::Unavailable,
                format!("no answer within {} s", limit.as_secs()),
            ))
        })
    })
}

/// A channel to `addr` (`host:port` or a URL), with TLS when a CA is given.
pub(super) async fn connect(client: &ClientArgs, addr: &str) -> Result<Channel, Failed> {
    let tls = client.tls_ca.is_some();
    let uri = if addr.contains("://") {
        addr.to_string()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    if uri.starts_with("https://") && !tls {
        return Err(Failed(Exit::Usage, format!("{uri}: TLS needs --tls-ca")));
    }
    let timeout = Duration::from_secs(client.timeout_seconds.max(1));
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| Failed(Exit::Usage, format!("{addr}: not an address: {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some(ca) = &client.tls_ca {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| Failed(Exit::Config, format!("reading {}: {e}", path.display())))
        };
        let host = endpoint.uri().host().unwrap_or("localhost").to_string();
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)?))
            .domain_name(client.tls_domain.clone().unwrap_or(host));
        if let (Some(cert), Some(key)) = (&client.client_cert, &client.client_key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| Failed(Exit::Config, format!("TLS: {e}")))?;
    }
    endpoint.connect().await.map_err(|e| {
        Failed(
            Exit::Unavailable,
            format!("cannot connect to {uri}: {}", crate::text::error_chain(&e)),
        )
    })
}

/// Largest admin answer read: a full `ListOverrides` (10 000 overrides with the longest
/// comments) or `Top` (1 024 names x 32 ids) is above tonic's 4 MiB default.
const MAX_ADMIN_ANSWER: usize = 64 << 20;

fn admin_client(channel: Channel) -> AdminClient {
    pb::admin_client::AdminClient::new(channel).max_decoding_message_size(MAX_ADMIN_ANSWER)
}

/// An admin request, with the bearer token when one is given.
fn admin_request<T>(client: &ClientArgs, message: T) -> Result<tonic::Request<T>, Failed> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = &client.admin_token {
        let value = format!("Bearer {token}").parse().map_err(|_| {
            Failed(
                Exit::Usage,
                "--admin-token: not a valid header value".into(),
            )
        })?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// A hint for the commonest misconfiguration: plaintext to a TLS listener, which answers
/// the HTTP/2 preface with a TLS alert (an h2 protocol or transport error here).
pub(super) fn hint(client: &ClientArgs, failed: Failed) -> Failed {
    let Failed(exit, message) = failed;
    let transport = message.contains("h2 protocol error") || message.contains("transport error");
    if client.tls_ca.is_none() && exit == Exit::Failure && transport {
        return Failed(
            exit,
            format!("{message} (does the server use TLS? then give --tls-ca)"),
        );
    }
    if exit == Exit::NoPermission && message.starts_with("Unauthenticated") {
        let hint = match client.admin_token {
            None => "no admin token was given: pass --admin-token or set CELLRATE_ADMIN_TOKEN",
            Some(_) => {
                "the admin token given (--admin-token or CELLRATE_ADMIN_TOKEN) is not the \
                 server's"
            }
        };
        return Failed(exit, format!("{message} ({hint})"));
    }
    Failed(exit, message)
}

/// One admin call to `addr`: connects, sends `message` with the bearer token, and returns
/// the answer; `call` picks the method (`|mut admin, request| async move {
/// admin.reset(request).await }`).
pub(super) async fn admin_call<M, A, F, Fut>(
    client: &ClientArgs,
    addr: &str,
    message: M,
    call: F,
) -> Result<A, Failed>
where
    F: FnOnce(AdminClient, tonic::Request<M>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<A>, tonic::Status>>,
{
    let channel = connect(client, addr).await?;
    let request = admin_request(client, message)?;
    Ok(call(admin_client(channel), request).await?.into_inner())
}

/// The one admin address of a command that acts on one replica.
pub(super) fn single_admin(client: &ClientArgs) -> Result<&str, Failed> {
    match client.admin_addr.as_slice() {
        [one] => Ok(one),
        _ => Err(Failed(
            Exit::Usage,
            "--admin-addr: this command takes one address (only `admin top` merges several)".into(),
        )),
    }
}
