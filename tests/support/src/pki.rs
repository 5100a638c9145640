//! A test certificate authority with a server certificate (for `localhost` and 127.0.0.1)
//! and a client certificate, all PEM.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl Pki {
    // Each call makes a new CA: not a default value.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "cellrate test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let params =
                CertificateParams::new(vec![name.to_string(), "127.0.0.1".to_string()]).unwrap();
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf("localhost");
        let (client_cert, client_key) = leaf("operator");
        Pki {
            ca,
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }

    /// Writes every file into `dir` (ca.pem, server.pem, server.key, client.pem,
    /// client.key).
    pub fn write(&self, dir: &std::path::Path) {
        for (name, text) in [
            ("ca.pem", &self.ca),
            ("server.pem", &self.server_cert),
            ("server.key", &self.server_key),
            ("client.pem", &self.client_cert),
            ("client.key", &self.client_key),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
}
