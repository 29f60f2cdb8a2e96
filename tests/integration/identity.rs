//! Client identity over real sockets: forwarding headers believed only from
//! trusted peers, the rightmost untrusted hop wins, PROXY protocol v1/v2.

use std::net::IpAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_http::proxy_protocol::{encode_v1, encode_v2};

use crate::fixtures::*;
use crate::support::WeirConfig;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_untrusted_peer_is_ignored_and_counted() {
    let (_up, weir) = weir_in_front("").await;
    let (status, _, body) = get_from(
        ip("127.0.3.4"),
        weir.addr,
        "/",
        &[("x-forwarded-for", "6.6.6.6")],
    )
    .await;
    assert_eq!(status, 200);
    let e = echo(&body);
    // The spoofed chain does not reach the app either.
    assert_eq!(e["headers"]["x-forwarded-for"], "127.0.3.4");
    let log = weir.access_log(1).await;
    assert_eq!(log[0]["client"], "127.0.3.4");
    assert_eq!(log[0]["client_source"], "peer");
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_forwarding_header_warnings_total{kind=\"untrusted_peer\"}",
        1.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_chains_resolve_to_the_rightmost_untrusted_hop() {
    let (_up, weir) =
        weir_in_front("[identity]\ntrusted_proxies = [\"127.0.9.0/24\", \"10.0.0.0/8\"]\n").await;
    let lb = ip("127.0.9.1");
    // (sent X-Forwarded-For, expected client)
    let cases = [
        ("203.0.113.7", "203.0.113.7"),
        // A client-supplied leftmost entry never wins over the hop our proxy saw.
        ("6.6.6.6, 203.0.113.7", "203.0.113.7"),
        // Multi-hop: the inner proxy 10.1.1.1 is trusted too.
        ("6.6.6.6, 198.51.100.9, 10.1.1.1", "198.51.100.9"),
        ("[2001:db8::5]:443, 10.2.2.2", "2001:db8::5"),
    ];
    for (i, (xff, want)) in cases.iter().enumerate() {
        let (status, _, body) = get_from(lb, weir.addr, "/", &[("x-forwarded-for", xff)]).await;
        assert_eq!(status, 200);
        let e = echo(&body);
        assert_eq!(
            e["headers"]["x-forwarded-for"],
            format!("{xff}, 127.0.9.1"),
            "case {i}"
        );
        let log = weir.access_log(i + 1).await;
        assert_eq!(log[i]["client"], *want, "case {i}: {xff}");
        assert_eq!(log[i]["peer"], "127.0.9.1");
        assert_eq!(log[i]["client_source"], "x_forwarded_for");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_forwarding_headers_never_panic() {
    let (_up, weir) = weir_in_front("[identity]\ntrusted_proxies = [\"127.0.9.1\"]\n").await;
    let junk = [
        "",
        ",,,",
        "not-an-ip",
        "1.2.3.4.5",
        "unknown",
        "[::1",
        "999.1.1.1, 1.2.3.4",
        "\t1.2.3.4 ,, x",
    ];
    for (i, j) in junk.iter().enumerate() {
        let (status, _, _) =
            get_from(ip("127.0.9.1"), weir.addr, "/", &[("x-forwarded-for", j)]).await;
        assert_eq!(status, 200, "case {i}: {j:?}");
    }
    let m = weir.metrics().await;
    assert_metric_at_least(
        &m,
        "weir_forwarding_header_warnings_total{kind=\"malformed\"}",
        3.0,
    );
}

async fn raw_request(stream: &mut tokio::net::TcpStream, prefix: &[u8]) -> String {
    // Writes may fail once weir has closed on a malformed header.
    let _ = stream.write_all(prefix).await;
    let _ = stream
        .write_all(b"GET /pp HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await;
    let mut out = Vec::new();
    // A reset (refused or malformed) ends the read like a close.
    let _ = stream.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_v1_and_v2_from_a_trusted_peer() {
    let up = Upstream::start().await;
    let cfg = WeirConfig::new(up.addr)
        .listener_keys("proxy_protocol = true")
        .then("[identity]\ntrusted_proxies = [\"127.0.9.1\"]\n")
        .toml();
    let weir = TestWeir::start(&cfg).await;
    let src = "198.51.100.20:40000".parse().unwrap();
    let dst = weir.addr;
    for (i, header) in [encode_v1(Some((src, dst))), encode_v2(Some((src, dst)))]
        .iter()
        .enumerate()
    {
        let mut s = connect_from(ip("127.0.9.1"), weir.addr).await.unwrap();
        let resp = raw_request(&mut s, header).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "v{}: {resp}", i + 1);
        assert!(
            resp.contains("\"x-forwarded-for\":\"198.51.100.20\""),
            "{resp}"
        );
        let log = weir.access_log(i + 1).await;
        assert_eq!(log[i]["client"], "198.51.100.20");
        assert_eq!(log[i]["client_source"], "proxy_protocol");
    }
    // From an untrusted peer the header is read but not believed.
    let mut s = connect_from(ip("127.0.7.7"), weir.addr).await.unwrap();
    let resp = raw_request(&mut s, &encode_v1(Some((src, dst)))).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let log = weir.access_log(3).await;
    assert_eq!(log[2]["client"], "127.0.7.7");
    // A malformed header closes the connection cleanly and is counted.
    let mut s = connect_from(ip("127.0.9.1"), weir.addr).await.unwrap();
    let resp = raw_request(&mut s, b"PROXY TCP4 nonsense\r\n").await;
    assert!(resp.is_empty(), "{resp}");
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_connection_errors_total{kind=\"proxy_protocol\"}",
        1.0,
    );
}
