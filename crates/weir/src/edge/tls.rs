//! TLS server configuration from PEM files (rustls with the ring provider).
//!
//! PEM parsing uses rustls-pki-types (rustls-pemfile is unmaintained). ALPN
//! offers `h2` (when the listener allows HTTP/2) and `http/1.1`.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// A TLS listener's files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate file `{path}`: {reason}")]
    Cert { path: String, reason: String },
    #[error("key file `{path}`: {reason}")]
    Key { path: String, reason: String },
    #[error("certificate and key do not form a usable pair: {0}")]
    Pair(String),
}

/// Builds an acceptor from a certificate chain file and a key file.
pub fn acceptor(cert: &str, key: &str, http2: bool) -> Result<TlsAcceptor, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(Path::new(cert))
        .map_err(|e| TlsError::Cert {
            path: cert.into(),
            reason: e.to_string(),
        })?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Cert {
            path: cert.into(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Cert {
            path: cert.into(),
            reason: "no CERTIFICATE block found".into(),
        });
    }
    let key_der = PrivateKeyDer::from_pem_file(Path::new(key)).map_err(|e| TlsError::Key {
        path: key.into(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Pair(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| TlsError::Pair(e.to_string()))?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(TlsAcceptor::from(Arc::new(config)))
}
