//! Admin security: an optional bearer token on admin RPCs, and optional TLS (with client
//! certificates for the admin listener) on the gRPC listeners.

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::service::token::Token;

/// Checks `authorization: Bearer <token>` on every call when a token is configured.
#[derive(Clone, Default)]
pub struct AdminAuth {
    token: Option<Token>,
}

impl AdminAuth {
    /// Requires `token` on every call; `None` lets every call through.
    pub fn new(token: Option<&str>) -> AdminAuth {
        AdminAuth {
            token: token.map(Token::new),
        }
    }
}

impl Interceptor for AdminAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.token else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            None => Err(Status::unauthenticated(
                "admin RPCs need `authorization: Bearer <token>`",
            )),
            Some(token) if expected.matches(token.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong admin token")),
        }
    }
}

/// PEM material for TLS on the gRPC listeners.
#[derive(Clone)]
pub struct TlsPem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// CA whose client certificates the admin listener requires (mTLS), if any.
    pub admin_client_ca: Option<Vec<u8>>,
    /// CA whose client certificates the decision listener requires (mTLS), if any.
    pub client_ca: Option<Vec<u8>>,
    /// The name (DNS name or IP address) a decision-listener client certificate must
    /// bear besides (`--client-san`, envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`).
    pub client_san: Option<String>,
}

/// Sizes only: the key stays out of logs and test failures.
impl std::fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = |pem: &Option<Vec<u8>>| pem.as_ref().map(Vec::len);
        f.debug_struct("TlsPem")
            .field("cert_bytes", &self.cert.len())
            .field("key_bytes", &self.key.len())
            .field("admin_client_ca_bytes", &len(&self.admin_client_ca))
            .field("client_ca_bytes", &len(&self.client_ca))
            .field("client_san", &self.client_san)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(auth: &mut AdminAuth, header: Option<&str>) -> Result<(), tonic::Code> {
        let mut request = Request::new(());
        if let Some(h) = header {
            request
                .metadata_mut()
                .insert("authorization", h.parse().unwrap());
        }
        auth.call(request).map(|_| ()).map_err(|s| s.code())
    }

    #[test]
    fn token_missing_wrong_and_right() {
        let mut auth = AdminAuth::new(Some("s3cret"));
        assert_eq!(call(&mut auth, None), Err(tonic::Code::Unauthenticated));
        assert_eq!(
            call(&mut auth, Some("Bearer nope")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            call(&mut auth, Some("s3cret")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(call(&mut auth, Some("Bearer s3cret")), Ok(()));
        let mut open = AdminAuth::new(None);
        assert_eq!(call(&mut open, None), Ok(()));
    }
}
