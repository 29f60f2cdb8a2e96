//! Ed25519 public keys as JSON Web Keys (RFC 8037), their RFC 7638
//! thumbprints, and the files operators keep them in.
//!
//! Web Bot Auth names a signing key by its JWK SHA-256 thumbprint
//! (`keyid`), and a crawler publishes its keys as a JWK Set at
//! `/.well-known/http-message-signatures-directory`
//! (draft-meunier-http-message-signatures-directory). weir reads such a
//! file (or a single JWK, or a bare `x` value from the configuration) into
//! [`PublicKey`]s keyed by their thumbprints.
//!
//! Owns: parsing, the thumbprint. Does not: fetch directories over the
//! network (operators copy the file; a machine without internet access must
//! still verify), check signatures ([`super::signature`]), or accept any
//! algorithm but Ed25519 (the one the architecture draft requires
//! verifiers to support; RSA keys in a directory are skipped).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// An Ed25519 public key and its RFC 7638 thumbprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The 32 bytes of the key (RFC 8032).
    pub bytes: [u8; 32],
    /// base64url (no padding) of SHA-256 over the key's canonical JWK:
    /// what a signature's `keyid` names.
    pub thumbprint: String,
}

/// Why a key, or a key file, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("`{0}` is not base64url (RFC 4648 §5, no padding)")]
    NotBase64(String),
    #[error("an Ed25519 key is 32 bytes; `{value}` is {len}")]
    WrongLength { value: String, len: usize },
    #[error("not a JWK or a JWK Set (JSON with `keys`): {0}")]
    NotJson(String),
    #[error("holds no Ed25519 key (`kty` \"OKP\", `crv` \"Ed25519\", `x`)")]
    NoEd25519Key,
    #[error("key {index}: {source}")]
    InFile {
        index: usize,
        #[source]
        source: Box<KeyError>,
    },
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: String, reason: String },
}

impl PublicKey {
    /// A key from a JWK's `x` member (base64url of the 32 key bytes).
    pub fn from_x(x: &str) -> Result<PublicKey, KeyError> {
        let x = x.trim();
        let bytes = URL_SAFE_NO_PAD
            .decode(x)
            .map_err(|_| KeyError::NotBase64(x.to_string()))?;
        let bytes: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::WrongLength {
                value: x.to_string(),
                len: bytes.len(),
            })?;
        Ok(PublicKey {
            thumbprint: thumbprint(&bytes),
            bytes,
        })
    }
}

/// RFC 7638 §3: SHA-256 over the required members of the key in
/// lexicographic order, without whitespace; for an OKP key (RFC 8037 §2)
/// `crv`, `kty`, `x`.
pub fn thumbprint(key: &[u8; 32]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(key)
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

/// One member of a JWK Set, as much of it as weir reads.
#[derive(Debug, Deserialize)]
struct Jwk {
    #[serde(default)]
    kty: String,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
}

/// A key file: a JWK Set (`{"keys": [...]}`, the directory format) or one JWK.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum KeyFile {
    Set { keys: Vec<Jwk> },
    One(Jwk),
}

/// The Ed25519 keys of a JWK Set or a single JWK. Other key types are
/// skipped (a directory may also list RSA keys); a malformed Ed25519 key,
/// or a file with none, is an error.
pub fn parse_key_file(text: &str) -> Result<Vec<PublicKey>, KeyError> {
    let file: KeyFile = serde_json::from_str(text).map_err(|e| KeyError::NotJson(e.to_string()))?;
    let jwks = match file {
        KeyFile::Set { keys } => keys,
        KeyFile::One(jwk) => vec![jwk],
    };
    let mut keys = Vec::new();
    for (index, jwk) in jwks.iter().enumerate() {
        if jwk.kty != "OKP" || jwk.crv.as_deref() != Some("Ed25519") {
            continue;
        }
        let in_file = |source| KeyError::InFile {
            index,
            source: Box::new(source),
        };
        let x = jwk.x.as_deref().ok_or(in_file(KeyError::NoEd25519Key))?;
        keys.push(PublicKey::from_x(x).map_err(in_file)?);
    }
    if keys.is_empty() {
        return Err(KeyError::NoEd25519Key);
    }
    Ok(keys)
}

/// [`parse_key_file`] on the file at `path`.
pub fn read_key_file(path: &str) -> Result<Vec<PublicKey>, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|e| KeyError::Unreadable {
        path: path.to_string(),
        reason: e.to_string(),
    })?;
    parse_key_file(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9421 B.1.4's `test-key-ed25519`, which the Web Bot Auth test
    /// vectors use too: its thumbprint is the vectors' `keyid`.
    pub(crate) const RFC9421_X: &str = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";
    const RFC9421_THUMBPRINT: &str = "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";

    #[test]
    fn thumbprint_of_the_test_key() {
        let key = PublicKey::from_x(RFC9421_X).unwrap();
        assert_eq!(key.thumbprint, RFC9421_THUMBPRINT);
    }

    #[test]
    fn key_files() {
        let jwk = format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{RFC9421_X}","kid":"a"}}"#);
        let rsa = r#"{"kty":"RSA","n":"AQAB","e":"AQAB"}"#;
        let bad_len = r#"{"kty":"OKP","crv":"Ed25519","x":"AAAA"}"#;
        let no_x = r#"{"kty":"OKP","crv":"Ed25519"}"#;
        let one = Ok(1);
        let cases: Vec<(String, Result<usize, &str>)> = vec![
            (jwk.clone(), one),
            (format!(r#"{{"keys":[{rsa},{jwk}]}}"#), one),
            (format!(r#"{{"keys":[{jwk},{jwk}]}}"#), Ok(2)),
            (
                format!(r#"{{"keys":[{rsa}]}}"#),
                Err("holds no Ed25519 key"),
            ),
            (r#"{"keys":[]}"#.into(), Err("holds no Ed25519 key")),
            (
                format!(r#"{{"keys":[{jwk},{bad_len}]}}"#),
                Err("key 1: an Ed25519 key is 32 bytes; `AAAA` is 3"),
            ),
            (format!(r#"{{"keys":[{no_x}]}}"#), Err("key 0: holds no")),
            ("not json".into(), Err("not a JWK or a JWK Set")),
            (
                r#"{"kty":"OKP","crv":"Ed25519","x":"not base64!"}"#.into(),
                Err("key 0: `not base64!` is not base64url"),
            ),
        ];
        for (text, want) in cases {
            let got = parse_key_file(&text)
                .map(|k| k.len())
                .map_err(|e| e.to_string());
            match (got, want) {
                (Ok(n), Ok(w)) => assert_eq!(n, w, "{text}"),
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{text}: {e}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }
}
