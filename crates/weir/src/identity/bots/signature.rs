//! Web Bot Auth: a request signed with HTTP Message Signatures (RFC 9421)
//! as the IETF webbotauth drafts profile them
//! (draft-meunier-web-bot-auth-architecture), checked against the Ed25519
//! keys an operator trusts.
//!
//! ```text
//! Signature-Agent: "https://crawler.example"
//! Signature-Input: sig1=("@authority" "signature-agent");created=1735689600;
//!                  expires=1735693200;keyid="poqk…";alg="ed25519";nonce="…";tag="web-bot-auth"
//! Signature:       sig1=:+NA/cssf…:
//! ```
//!
//! [`verify`] looks for the `Signature-Input` member tagged `web-bot-auth`,
//! requires `keyid` to be the RFC 7638 thumbprint of a trusted key, `alg`
//! (when present) `ed25519`, `created` and `expires` around the injected
//! time within a small skew, and `@authority` (and `signature-agent` when
//! that field is sent) among the covered components; then builds the
//! signature base exactly as RFC 9421 §2.5 says (each component's
//! identifier and value on a line, then `@signature-params` as the
//! structured-field serialisation of the inner list) and checks the
//! Ed25519 signature with `ring`. Structured fields are parsed and
//! serialised by the `sfv` crate, not by hand.
//!
//! Owns: parsing the two fields, the signature base, the checks. Does not:
//! know which bot a key belongs to beyond the [`Keyring`]'s answer, count
//! anything (the caller records [`Rejection::as_str`]), fetch key
//! directories, or remember nonces: a signature can be replayed until it
//! expires (the draft leaves replay protection optional; a crawler's
//! signatures live minutes, and the lane it buys is bounded anyway).

use std::collections::HashMap;

use http::{HeaderMap, HeaderName};
use sfv::{BareItem, Dictionary, FieldType as _, InnerList, Item, ListEntry, Parser};

use super::jwk::PublicKey;

/// The `tag` the architecture draft gives Web Bot Auth signatures.
pub const TAG: &str = "web-bot-auth";

/// Most `Signature-Input` members looked at: a request carries one or two;
/// more is somebody making the verifier work.
const MAX_MEMBERS: usize = 4;

/// Most covered components: the profile needs two; a long list only costs.
const MAX_COMPONENTS: usize = 16;

/// Trusted keys by thumbprint, each with the index of the bot it belongs to.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: HashMap<String, ([u8; 32], usize)>,
}

impl Keyring {
    /// Adds `key` as one of bot `bot`'s. A thumbprint already listed keeps
    /// its first bot (configuration refuses two bots sharing a key).
    pub fn insert(&mut self, key: &PublicKey, bot: usize) -> bool {
        if self.keys.contains_key(&key.thumbprint) {
            return false;
        }
        self.keys.insert(key.thumbprint.clone(), (key.bytes, bot));
        true
    }

    /// The bot whose key has this thumbprint.
    pub fn bot_of(&self, thumbprint: &str) -> Option<usize> {
        self.keys.get(thumbprint).map(|(_, bot)| *bot)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The parts of a request a signature can cover, as weir read them (the
/// canonical target, the fields as received).
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    pub method: &'a str,
    /// `https` or `http`: how the client reached weir.
    pub scheme: &'a str,
    /// `host[:port]`, lowercase (the target's authority).
    pub authority: &'a str,
    pub path: &'a str,
    /// Without its `?`.
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

/// Why a request's signature proves nothing. Labels are bounded: they are
/// the `result` of `weir_bot_verifications_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No `Signature-Input` member tagged `web-bot-auth`.
    NotWebBotAuth,
    /// A field, a parameter or a component that cannot be read, or one
    /// this profile does not support (another algorithm, `;bs`, `;req`).
    Malformed,
    /// `@authority`, or `signature-agent` while that field is sent, is not
    /// covered.
    NotCovered,
    /// `keyid` names no trusted key.
    UnknownKey,
    /// `expires` is past (beyond the skew) or before `created`.
    Expired,
    /// `created` is in the future (beyond the skew).
    NotYetValid,
    /// The Ed25519 signature does not verify.
    BadSignature,
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::NotWebBotAuth => "not_web_bot_auth",
            Rejection::Malformed => "malformed",
            Rejection::NotCovered => "not_covered",
            Rejection::UnknownKey => "unknown_key",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::BadSignature => "bad_signature",
        }
    }
}

/// The signature's fields, named once: a `&str` name is parsed on every
/// lookup, and this one runs for every request while `[bots]` is on.
const SIGNATURE_INPUT: HeaderName = HeaderName::from_static("signature-input");
const SIGNATURE: HeaderName = HeaderName::from_static("signature");

/// Whether the request carries a Web Bot Auth signature at all (and so is
/// worth verifying and counting).
pub fn is_signed(headers: &HeaderMap) -> bool {
    headers.contains_key(SIGNATURE_INPUT) && headers.contains_key(SIGNATURE)
}

/// Checks the request's Web Bot Auth signature at `now` (Unix seconds),
/// allowing `skew` seconds of clock difference. `Ok`: the index of the bot
/// whose key signed it.
pub fn verify(
    req: &SignedRequest<'_>,
    keys: &Keyring,
    now: u64,
    skew: u64,
) -> Result<usize, Rejection> {
    let inputs = dictionary(req.headers, "signature-input")?;
    let signatures = dictionary(req.headers, "signature")?;
    let mut first_rejection = Rejection::NotWebBotAuth;
    let tagged = inputs
        .iter()
        .take(MAX_MEMBERS)
        .filter_map(|(label, entry)| match entry {
            ListEntry::InnerList(params) if string_param(&params.params, "tag") == Some(TAG) => {
                Some((label, params))
            }
            _ => None,
        });
    for (label, params) in tagged {
        let signature = match signatures.get(label.as_str()) {
            Some(ListEntry::Item(Item {
                bare_item: BareItem::ByteSequence(bytes),
                ..
            })) => bytes.as_slice(),
            _ => return Err(Rejection::Malformed),
        };
        match verify_member(req, params, signature, keys, now, skew) {
            Ok(bot) => return Ok(bot),
            // The first tagged member's reason is the one reported.
            Err(r) if first_rejection == Rejection::NotWebBotAuth => first_rejection = r,
            Err(_) => {}
        }
    }
    Err(first_rejection)
}

/// One tagged `Signature-Input` member against its signature.
fn verify_member(
    req: &SignedRequest<'_>,
    params: &InnerList,
    signature: &[u8],
    keys: &Keyring,
    now: u64,
    skew: u64,
) -> Result<usize, Rejection> {
    let p = &params.params;
    // `alg` is optional in RFC 9421 (the key decides); present, it must
    // name the one algorithm weir verifies.
    match p.get("alg") {
        None => {}
        Some(BareItem::String(alg)) if alg.as_str() == "ed25519" => {}
        Some(_) => return Err(Rejection::Malformed),
    }
    let created = integer_param(p, "created").ok_or(Rejection::Malformed)?;
    let expires = integer_param(p, "expires").ok_or(Rejection::Malformed)?;
    let keyid = string_param(p, "keyid").ok_or(Rejection::Malformed)?;
    check_covered(req.headers, params)?;
    let now = i64::try_from(now).unwrap_or(i64::MAX);
    let skew = i64::try_from(skew).unwrap_or(0);
    if created > now.saturating_add(skew) {
        return Err(Rejection::NotYetValid);
    }
    if expires < created || expires < now.saturating_sub(skew) {
        return Err(Rejection::Expired);
    }
    let (key, bot) = keys.keys.get(keyid).ok_or(Rejection::UnknownKey)?;
    let base = signature_base(req, params)?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(base.as_bytes(), signature)
        .map_err(|_| Rejection::BadSignature)?;
    Ok(*bot)
}

/// The profile's required components: `@authority` always, and
/// `signature-agent` whenever that field is sent (else a crawler's claim
/// of who it is could be swapped).
fn check_covered(headers: &HeaderMap, params: &InnerList) -> Result<(), Rejection> {
    let covers = |name: &str| {
        params
            .items
            .iter()
            .any(|i| matches!(&i.bare_item, BareItem::String(s) if s.as_str() == name))
    };
    if !covers("@authority") {
        return Err(Rejection::NotCovered);
    }
    if headers.contains_key("signature-agent") && !covers("signature-agent") {
        return Err(Rejection::NotCovered);
    }
    Ok(())
}

/// RFC 9421 §2.5: one line per covered component, `"name";params: value`,
/// then `"@signature-params": ` and the serialised inner list. No trailing
/// newline.
pub fn signature_base(req: &SignedRequest<'_>, params: &InnerList) -> Result<String, Rejection> {
    if params.items.len() > MAX_COMPONENTS {
        return Err(Rejection::Malformed);
    }
    let mut base = String::new();
    let mut seen: Vec<String> = Vec::with_capacity(params.items.len());
    for component in &params.items {
        // The identifier is the component's serialisation, parameters
        // included; a component may be covered once.
        let id = component.serialize();
        if seen.contains(&id) {
            return Err(Rejection::Malformed);
        }
        let value = component_value(req, component)?;
        base.push_str(&id);
        base.push_str(": ");
        base.push_str(&value);
        base.push('\n');
        seen.push(id);
    }
    let list: sfv::List = vec![ListEntry::InnerList(params.clone())];
    base.push_str("\"@signature-params\": ");
    base.push_str(&list.serialize().ok_or(Rejection::Malformed)?);
    Ok(base)
}

/// A covered component's value (RFC 9421 §2.1, §2.2): the derived
/// components of a request, or a field's value (its lines trimmed and
/// joined with `, `; with `;key`, the dictionary member re-serialised).
fn component_value(req: &SignedRequest<'_>, component: &Item) -> Result<String, Rejection> {
    let BareItem::String(name) = &component.bare_item else {
        return Err(Rejection::Malformed);
    };
    let name = name.as_str();
    let params = &component.params;
    if name.starts_with('@') {
        if !params.is_empty() {
            return Err(Rejection::Malformed);
        }
        return derived_component_value(req, name);
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(Rejection::Malformed);
    }
    field_component_value(req, name, params)
}

/// A derived component's value (RFC 9421 §2.2): `@method`, `@path` and the
/// like, from the request's parts.
fn derived_component_value(req: &SignedRequest<'_>, name: &str) -> Result<String, Rejection> {
    let query = req.query.unwrap_or("");
    Ok(match name {
        "@method" => req.method.to_string(),
        "@authority" => req.authority.to_ascii_lowercase(),
        "@scheme" => req.scheme.to_string(),
        "@path" if req.path.is_empty() => "/".to_string(),
        "@path" => req.path.to_string(),
        "@query" => format!("?{query}"),
        "@target-uri" => {
            let q = req.query.map(|q| format!("?{q}")).unwrap_or_default();
            format!("{}://{}{}{q}", req.scheme, req.authority, req.path)
        }
        "@request-target" => match req.query {
            Some(q) => format!("{}?{q}", req.path),
            None => req.path.to_string(),
        },
        _ => return Err(Rejection::Malformed),
    })
}

/// A field's value (RFC 9421 §2.1): its lines trimmed and joined with
/// `, `; with `;key`, the dictionary member re-serialised.
fn field_component_value(
    req: &SignedRequest<'_>,
    name: &str,
    params: &sfv::Parameters,
) -> Result<String, Rejection> {
    let lines: Vec<&str> = req
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().map(str::trim))
        .collect::<Result<_, _>>()
        .map_err(|_| Rejection::Malformed)?;
    if lines.is_empty() {
        return Err(Rejection::Malformed);
    }
    let joined = lines.join(", ");
    match params
        .keys()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => Ok(joined),
        ["key"] => {
            let member = string_param(params, "key").ok_or(Rejection::Malformed)?;
            let dict: Dictionary = Parser::new(&joined)
                .parse()
                .map_err(|_| Rejection::Malformed)?;
            let entry = dict.get(member).ok_or(Rejection::Malformed)?;
            match entry {
                ListEntry::Item(item) => Ok(item.serialize()),
                ListEntry::InnerList(_) => {
                    vec![entry.clone()].serialize().ok_or(Rejection::Malformed)
                }
            }
        }
        // `sf`, `bs`, `req`, `tr`: not needed by the profile.
        _ => Err(Rejection::Malformed),
    }
}

/// A field parsed as a structured-field dictionary (all its lines).
fn dictionary(headers: &HeaderMap, name: &str) -> Result<Dictionary, Rejection> {
    let mut joined = String::new();
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            joined.push_str(", ");
        }
        joined.push_str(v.to_str().map_err(|_| Rejection::Malformed)?);
    }
    Parser::new(&joined)
        .parse()
        .map_err(|_| Rejection::Malformed)
}

fn string_param<'a>(params: &'a sfv::Parameters, name: &str) -> Option<&'a str> {
    match params.get(name)? {
        BareItem::String(s) => Some(s.as_str()),
        _ => None,
    }
}

fn integer_param(params: &sfv::Parameters, name: &str) -> Option<i64> {
    match params.get(name)? {
        BareItem::Integer(i) => Some(i64::from(*i)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
