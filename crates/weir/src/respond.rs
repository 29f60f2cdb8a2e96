//! The rescue: every response weir makes itself, built in one place from a
//! typed reason.
//!
//! A stage that refuses or fails says *why* with a value that implements
//! [`Reason`]: policy's [`RejectReason`](crate::policy::RejectReason)
//! (rules, limits, unreadable targets, shedding), upstream's
//! [`ForwardError`](crate::upstream::ForwardError), the client codec's
//! [`ClientError`](weir_http::server::ClientError). Each declares, beside
//! its own doc, its status, its bounded label (`x-weir-reason`, the access
//! log's `rule`, metric labels), what the client is told, when to retry, and
//! whose fault it was ([`Side`]): a client's broken upload is the client's
//! (400/408), never a 502 that pages someone about the app. [`answer`] turns
//! any of them into the response, in the format the client asked for, with
//! the operator's templates for refusals.
//!
//! It does not decide anything, record metrics or write the log (the
//! composer, `proxy`, does, once per request), and it does not build the
//! challenge's page (`challenge::page` does: it is a page, not an error).
//!
//! ```
//! use weir::respond::{self, Accepts, Reason, Side};
//! use weir::policy::RejectReason;
//!
//! let resp = respond::answer(&RejectReason::NoRoute, Accepts::Json, &Default::default());
//! assert_eq!(resp.status(), 404);
//! assert_eq!(resp.headers()["x-weir-reason"], "no_route");
//! assert_eq!(RejectReason::NoRoute.side(), Side::Client);
//! ```

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use weir_http::body::ResponseBody;

use crate::config::RejectionConfig;

/// Whose fault an answer is: what alerts and dashboards split on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent what cannot be served, too much, too slowly, or
    /// nothing at all (a stalled or cut upload): 4xx, no one is paged.
    Client,
    /// The app did not answer, or answered badly: 502/504.
    Upstream,
    /// weir chose to refuse or shed (a limit, a full queue, a drain).
    Weir,
}

impl Side {
    pub fn as_str(&self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Weir => "weir",
        }
    }
}

/// Why weir answers a request itself. Implemented beside each stage's own
/// reasons, so a new reason cannot be added without saying all of this.
pub trait Reason {
    /// The status the client gets.
    fn status(&self) -> StatusCode;
    /// A bounded label: `x-weir-reason`, the access log's `rule`, metrics.
    fn label(&self) -> &str;
    /// What the client is told, in a sentence without a final period.
    fn message(&self) -> String;
    /// When the client may try again (`Retry-After`), if it may.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
    /// Whose fault it is.
    fn side(&self) -> Side;
    /// Whether the operator's `[rejection]` templates apply (refusals; an
    /// upstream failure is told plainly).
    fn templated(&self) -> bool {
        true
    }
    /// Fields of its own (the rate-limit policy that fired).
    fn extra_fields(&self, _headers: &mut HeaderMap) {}
}

/// Which body format a client prefers for an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    Html,
    Json,
    Text,
}

impl Accepts {
    /// From the request's `Accept` fields.
    pub fn of(headers: &HeaderMap) -> Accepts {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if accept.contains("text/html") {
            Accepts::Html
        } else if accept.contains("json") {
            Accepts::Json
        } else {
            Accepts::Text
        }
    }
}

/// The response for `reason`: status, `Retry-After`, `x-weir-reason`,
/// `Cache-Control: no-store`, and a body in the client's format (the
/// operator's template when there is one and the reason takes it).
pub fn answer(
    reason: &(impl Reason + ?Sized),
    accept: Accepts,
    templates: &RejectionConfig,
) -> Response<ResponseBody> {
    let status = reason.status();
    let label = reason.label();
    let message = reason.message();
    let retry = reason
        .retry_after()
        .map(|d| d.as_secs_f64().ceil().max(1.0) as u64);
    let template = match accept {
        _ if !reason.templated() => None,
        Accepts::Html => templates.html.as_deref(),
        Accepts::Json => templates.json.as_deref(),
        Accepts::Text => templates.text.as_deref(),
    };
    let body = match template {
        Some(t) => t
            .replace("{status}", status.as_str())
            .replace("{retry_after}", &retry.unwrap_or(0).to_string())
            .replace("{rule}", label),
        None => default_body(status, label, &message, retry, accept),
    };
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    let content_type = match accept {
        Accepts::Html => "text/html; charset=utf-8",
        Accepts::Json => "application/json",
        Accepts::Text => "text/plain; charset=utf-8",
    };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(after) = retry {
        h.insert(header::RETRY_AFTER, HeaderValue::from(after));
    }
    if let Ok(v) = HeaderValue::from_str(label) {
        h.insert("x-weir-reason", v);
    }
    reason.extra_fields(h);
    resp
}

fn default_body(
    status: StatusCode,
    label: &str,
    message: &str,
    retry: Option<u64>,
    accept: Accepts,
) -> String {
    match accept {
        Accepts::Html => format!(
            "<!doctype html><html lang=\"en\"><meta charset=\"utf-8\"><title>{code}</title><h1>Please wait a moment</h1><p>{message}.</p>{retry_line}</html>\n",
            code = status.as_u16(),
            retry_line = retry.map_or(String::new(), |s| format!(
                "<p>Try again in {s} seconds.</p>"
            )),
        ),
        Accepts::Json => serde_json::json!({
            "status": status.as_u16(),
            "error": message,
            "reason": label,
            "retry_after": retry,
        })
        .to_string(),
        Accepts::Text => format!(
            "{} {}: {message}\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ),
    }
}

/// What a connection refused at accept is told (plain listeners), before
/// weir has read anything: written with one non-blocking write, then the
/// connection closes.
pub const REFUSED_AT_ACCEPT: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// The client codec's refusals of a request head it cannot read.
impl Reason for weir_http::server::ClientError {
    fn status(&self) -> StatusCode {
        self.reply_status().unwrap_or(StatusCode::BAD_REQUEST)
    }

    fn label(&self) -> &str {
        self.label()
    }

    fn message(&self) -> String {
        self.to_string()
    }

    fn side(&self) -> Side {
        Side::Client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Stalled;

    impl Reason for Stalled {
        fn status(&self) -> StatusCode {
            StatusCode::REQUEST_TIMEOUT
        }
        fn label(&self) -> &str {
            "client_body_timeout"
        }
        fn message(&self) -> String {
            "the request body stopped arriving".into()
        }
        fn side(&self) -> Side {
            Side::Client
        }
        fn templated(&self) -> bool {
            false
        }
    }

    #[test]
    fn answers_in_the_clients_format_with_its_reason() {
        let none = RejectionConfig::default();
        let text = answer(&Stalled, Accepts::Text, &none);
        assert_eq!(text.status(), 408);
        assert_eq!(text.headers()["x-weir-reason"], "client_body_timeout");
        assert_eq!(text.headers()["cache-control"], "no-store");
        assert!(!text.headers().contains_key("retry-after"));
        let html = answer(&Stalled, Accepts::Html, &none);
        assert_eq!(html.headers()["content-type"], "text/html; charset=utf-8");
        // A reason that takes no template is told plainly even when the
        // operator wrote one.
        let templates = RejectionConfig {
            text: Some("busy {status}".into()),
            ..RejectionConfig::default()
        };
        let plain = answer(&Stalled, Accepts::Text, &templates);
        assert_eq!(
            http_body::Body::size_hint(plain.body()).exact(),
            Some("408 Request Timeout: the request body stopped arriving\n".len() as u64)
        );
    }
}
