//! One line per case: the spellings of incident reports and RFC 3986 §5.4's
//! examples, read as weir reads them.

use super::*;

const DEFAULT: PathPolicy = PathPolicy {
    keep_encoded_slash: false,
};

fn request(method: &str, target: &str, version: Version, hosts: &[&str]) -> Request<()> {
    let mut req = Request::new(());
    *req.method_mut() = Method::from_bytes(method.as_bytes()).unwrap();
    *req.uri_mut() = target.parse().unwrap();
    *req.version_mut() = version;
    for h in hosts {
        req.headers_mut()
            .append(header::HOST, HeaderValue::from_str(h).unwrap());
    }
    req
}

fn read(target: &str) -> Result<Target, TargetError> {
    Target::of(
        &request("GET", target, Version::HTTP_11, &["wiki.example"]),
        DEFAULT,
    )
}

fn path(target: &str) -> Result<String, TargetError> {
    read(target).map(|t| t.path_and_query().to_string())
}

macro_rules! canonical {
    ($($raw:expr => $want:expr),* $(,)?) => {$(
        assert_eq!(path($raw).as_deref(), Ok($want), "{}", $raw);
    )*};
}

macro_rules! refused {
    ($($raw:expr => $why:expr),* $(,)?) => {$(
        assert_eq!(path($raw).map_err(|e| e.reason()), Err($why), "{}", $raw);
    )*};
}

#[test]
fn spellings_of_one_page_read_as_one_path() {
    // Issue 17: each of these reached the app as /w/index.php.
    canonical! {
        "/w/index.php?search=a" => "/w/index.php?search=a",
        "//w/index.php?search=a" => "/w/index.php?search=a",
        "/w//index.php?search=a" => "/w/index.php?search=a",
        "/./w/index.php?search=a" => "/w/index.php?search=a",
        "/w/./index.php?search=a" => "/w/index.php?search=a",
        "/static/../w/index.php?search=a" => "/w/index.php?search=a",
        "/static/%2e%2e/w/index.php?search=a" => "/w/index.php?search=a",
        "/static/%2E%2E/w/index.php" => "/w/index.php",
        "/w/index%2ephp?search=a" => "/w/index.php?search=a",
        "/w/%69ndex.php?search=a" => "/w/index.php?search=a",
        "/%77/index.php" => "/w/index.php",
        "/w/index.php/" => "/w/index.php/",
    }
}

#[test]
fn dot_segments_follow_rfc_3986() {
    canonical! {
        "/" => "/",
        "/a/b/c/./../../g" => "/a/g",
        "/a/b/../" => "/a/",
        "/a/.." => "/",
        "/a/." => "/a/",
        "/.." => "/",
        "/../../x" => "/x",
        "/a/b/.." => "/a/",
        "/mid/content=5/../6" => "/mid/6",
        "/a/..b/.c/b." => "/a/..b/.c/b.",
        "/.well-known/acme" => "/.well-known/acme",
        "///" => "/",
        "/a///b//" => "/a/b/",
    }
}

#[test]
fn escapes_are_decoded_when_unreserved_and_uppercased_otherwise() {
    canonical! {
        "/wiki/Caf%c3%a9" => "/wiki/Caf%C3%A9",
        "/wiki/Special%3aSearch" => "/wiki/Special:Search",
        "/~user%40host" => "/~user@host",
        "/a%3Bb" => "/a%3Bb",
        "/a%3fb" => "/a%3Fb",
        "/a%20b" => "/a%20b",
        "/%7euser/%41" => "/~user/A",
        "/a%25b" => "/a%25b",
        "/wiki/Foo;bar" => "/wiki/Foo;bar",
        "/a;x/b" => "/a;x/b",
    }
}

#[test]
fn ambiguous_paths_are_refused() {
    refused! {
        "/w/index%zz" => "invalid_escape",
        "/w/index%2" => "invalid_escape",
        "/w/index%" => "invalid_escape",
        "/a%2/b" => "invalid_escape",
        "/a%00b" => "nul_in_path",
        "/a%5cb" => "backslash_in_path",
        "/a%5Cb" => "backslash_in_path",
        "/w%2Findex.php" => "encoded_slash",
        "/w%2findex.php" => "encoded_slash",
        "/static/..;/admin" => "dot_parameter",
        "/static/.;x/admin" => "dot_parameter",
        "/%2e%2e;/admin" => "dot_parameter",
    }
}

#[test]
fn an_encoded_slash_can_be_kept_as_data() {
    let keep = PathPolicy {
        keep_encoded_slash: true,
    };
    let req = request(
        "GET",
        "/api/v4/projects/group%2fproject",
        Version::HTTP_11,
        &["git.example"],
    );
    let t = Target::of(&req, keep).unwrap();
    assert_eq!(t.path(), "/api/v4/projects/group%2Fproject");
    assert_eq!(t.match_path(), "/api/v4/projects/group%2Fproject");
}

#[test]
fn the_match_path_is_the_path_the_app_decodes() {
    let t = read("/wiki/Special%3ASearch/x%20y%2Bz").unwrap();
    assert_eq!(t.path(), "/wiki/Special:Search/x%20y%2Bz");
    assert_eq!(t.match_path(), "/wiki/Special:Search/x y+z");
    // Not UTF-8 once decoded: matched as written.
    let t = read("/wiki/Caf%E9").unwrap();
    assert_eq!(t.match_path(), "/wiki/Caf%E9");
    // A path without escapes is its own match path.
    let t = read("/wiki/Main_Page").unwrap();
    assert_eq!(t.match_path(), "/wiki/Main_Page");
}

#[test]
fn a_canonical_path_is_shared_not_rebuilt() {
    let req = request(
        "GET",
        "/wiki/Main_Page?action=history",
        Version::HTTP_11,
        &["w.example"],
    );
    let t = Target::of(&req, DEFAULT).unwrap();
    assert!(!t.rewritten);
    assert!(t.decoded.is_none());
    let shared = req.uri().path_and_query().unwrap().as_str().as_ptr();
    assert_eq!(t.path_and_query().as_ptr(), shared, "the request's bytes");
    let host = req.headers()[header::HOST].as_bytes().as_ptr();
    assert_eq!(t.authority().unwrap().as_str().as_ptr(), host);
}

#[test]
fn query_keys_are_read_as_apps_decode_them() {
    let keys = |q: &str| query_keys(q).map(|k| k.into_owned()).collect::<Vec<_>>();
    assert_eq!(keys("search=a&title=b"), ["search", "title"]);
    assert_eq!(keys("%73earch=a"), ["search"]);
    assert_eq!(keys("search%3Da=1"), ["search=a"]);
    assert_eq!(keys("se+arch=1&&x"), ["se arch", "x"]);
    assert_eq!(keys("search[]=1&q[a]=2"), ["search", "q"]);
    assert_eq!(keys("%zz=1"), ["%zz"]);
    assert_eq!(keys(""), Vec::<String>::new());

    let t = read("/w/index.php?%73earch=a").unwrap();
    assert!(t.has_query_key(&["search"]));
    let t = read("/w/index.php?search%3Da").unwrap();
    assert!(!t.has_query_key(&["search"]));
    assert_eq!(t.query(), Some("search%3Da"), "forwarded as received");
}

#[test]
fn pairs_taken_from_the_query_leave_the_rest_as_received() {
    let take = |uri: &str| {
        let mut t = read(uri).unwrap();
        let values = t.take_query_pairs("weir_pass");
        (values, t.path_and_query().to_owned())
    };
    let some = |v: &[&str], rest: &str| {
        let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        (v, rest.to_owned())
    };
    assert_eq!(take("/w?weir_pass=abc"), some(&["abc"], "/w"));
    assert_eq!(
        take("/w?a=1&weir_pass=abc&b=%20"),
        some(&["abc"], "/w?a=1&b=%20")
    );
    // Regression (issue 54): only the first was taken, and the second
    // reached the app and the log.
    assert_eq!(
        take("/w?weir_pass=junk&weir_pass=T"),
        some(&["junk", "T"], "/w")
    );
    assert_eq!(take("/w?weir_pass"), some(&[""], "/w"));
    // Every spelling the app reads as the key.
    assert_eq!(
        take("/w?%77eir_pass=a&weir%5Fpass=b&weir_pass[]=c&q=1"),
        some(&["a", "b", "c"], "/w?q=1")
    );
    for uri in ["/w?weir_passport=1", "/w?xweir_pass=1", "/w?q=%20", "/w"] {
        assert_eq!(take(uri), (Vec::new(), uri.to_owned()), "{uri}");
    }
}

fn authority_of(
    version: Version,
    target: &str,
    hosts: &[&str],
) -> Result<Option<String>, &'static str> {
    Target::of(&request("GET", target, version, hosts), DEFAULT)
        .map(|t| t.authority().map(|a| a.as_str().to_string()))
        .map_err(|e| e.reason())
}

/// HTTP version, request target, `Host` fields: the authority, or why not.
type AuthorityCase<'a> = (
    Version,
    &'a str,
    &'a [&'a str],
    Result<Option<&'a str>, &'a str>,
);

#[test]
fn one_authority_per_request() {
    use Version as V;
    let cases: &[AuthorityCase<'_>] = &[
        (
            V::HTTP_11,
            "/x",
            &["wiki.example"],
            Ok(Some("wiki.example")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["Wiki.EXAMPLE"],
            Ok(Some("wiki.example")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["wiki.example."],
            Ok(Some("wiki.example")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["wiki.example:8080"],
            Ok(Some("wiki.example:8080")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["wiki.example:08080"],
            Ok(Some("wiki.example:8080")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["wiki.example:"],
            Ok(Some("wiki.example")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["[2001:db8::1]:443"],
            Ok(Some("[2001:db8::1]:443")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["[2001:DB8:0::1]"],
            Ok(Some("[2001:db8::1]")),
        ),
        (
            V::HTTP_11,
            "/x",
            &["127.0.0.1:80"],
            Ok(Some("127.0.0.1:80")),
        ),
        (V::HTTP_11, "/x", &[""], Ok(None)),
        (V::HTTP_10, "/x", &[], Ok(None)),
        (V::HTTP_11, "/x", &[], Err("missing_host")),
        (
            V::HTTP_11,
            "/x",
            &["a.example", "admin.example"],
            Err("duplicate_host"),
        ),
        (
            V::HTTP_11,
            "/x",
            &["a.example", "a.example"],
            Err("duplicate_host"),
        ),
        // Issue 17: `Host: [abc` panicked in strip_port.
        (V::HTTP_11, "/x", &["[abc"], Err("invalid_host")),
        (V::HTTP_11, "/x", &["[abc]"], Err("invalid_host")),
        (V::HTTP_11, "/x", &["[::1]x"], Err("invalid_host")),
        (V::HTTP_11, "/x", &["a.example:99999"], Err("invalid_host")),
        (V::HTTP_11, "/x", &["a.example:8x"], Err("invalid_host")),
        (V::HTTP_11, "/x", &["a..example"], Err("invalid_host")),
        (V::HTTP_11, "/x", &[".a.example"], Err("invalid_host")),
        (V::HTTP_11, "/x", &["."], Err("invalid_host")),
        (V::HTTP_11, "/x", &["a example"], Err("invalid_host")),
        (
            V::HTTP_11,
            "/x",
            &["x\", for=6.6.6.6;host=\"y"],
            Err("invalid_host"),
        ),
        (
            V::HTTP_11,
            "/x",
            &["a.example,b.example"],
            Err("invalid_host"),
        ),
        (V::HTTP_11, "/x", &["user@a.example"], Err("invalid_host")),
        // Absolute form: the target's host is the request's, and Host agrees.
        (
            V::HTTP_11,
            "http://a.example/x",
            &["a.example"],
            Ok(Some("a.example")),
        ),
        (
            V::HTTP_11,
            "http://A.example/x",
            &["a.example:80"],
            Ok(Some("a.example")),
        ),
        (
            V::HTTP_11,
            "https://a.example/x",
            &["a.example:443"],
            Ok(Some("a.example")),
        ),
        (
            V::HTTP_11,
            "http://a.example/x",
            &["admin.example"],
            Err("host_mismatch"),
        ),
        (
            V::HTTP_11,
            "http://a.example:81/x",
            &["a.example"],
            Err("host_mismatch"),
        ),
        (
            V::HTTP_11,
            "http://a.example/x",
            &[""],
            Err("host_mismatch"),
        ),
        (V::HTTP_11, "http://a.example/x", &[], Err("missing_host")),
        (V::HTTP_10, "http://a.example/x", &[], Ok(Some("a.example"))),
        // HTTP/2: `:authority` (the URI's) and `host` must agree.
        (V::HTTP_2, "https://a.example/x", &[], Ok(Some("a.example"))),
        (
            V::HTTP_2,
            "https://a.example/x",
            &["a.example"],
            Ok(Some("a.example")),
        ),
        (
            V::HTTP_2,
            "https://a.example/x",
            &["admin.example"],
            Err("host_mismatch"),
        ),
        (V::HTTP_2, "/x", &["a.example"], Ok(Some("a.example"))),
    ];
    for (i, (version, target, hosts, want)) in cases.iter().enumerate() {
        let want = want.map(|w| w.map(str::to_string));
        assert_eq!(
            authority_of(*version, target, hosts),
            want,
            "case {i}: {version:?} {target} {hosts:?}"
        );
    }
}

#[test]
fn request_target_forms() {
    let form = |method: &str, target: &str| {
        Target::of(
            &request(method, target, Version::HTTP_11, &["a.example"]),
            DEFAULT,
        )
        .map(|t| t.path().to_string())
        .map_err(|e| e.reason())
    };
    assert_eq!(form("GET", "a.example"), Err("invalid_target"));
    assert_eq!(form("GET", "a.example:80"), Err("invalid_target"));
    assert_eq!(form("OPTIONS", "*"), Ok("*".into()));
    assert_eq!(form("GET", "*"), Err("invalid_target"));
    assert_eq!(form("GET", "http://a.example"), Ok("/".into()));
}

#[test]
fn methods_are_case_sensitive() {
    let method = |m: &str| {
        Target::of(&request(m, "/x", Version::HTTP_11, &["a.example"]), DEFAULT)
            .map(|t| t.method().to_string())
            .map_err(|e| (e.reason(), e.status().as_u16()))
    };
    assert_eq!(method("GET"), Ok("GET".into()));
    assert_eq!(method("PROPFIND"), Ok("PROPFIND".into()));
    assert_eq!(method("get"), Err(("method_case", 501)));
    assert_eq!(method("Get"), Err(("method_case", 501)));
    assert_eq!(method("CONNECT"), Err(("connect", 501)));
}

#[test]
fn forwarding_says_what_was_decided() {
    // Absolute form and a rewritten path: origin form, canonical Host.
    let mut req = request(
        "GET",
        "http://Wiki.Example/w//index.php?search=a",
        Version::HTTP_11,
        &["wiki.example"],
    );
    let t = Target::of(&req, DEFAULT).unwrap();
    t.forward(&mut req);
    assert_eq!(req.uri().to_string(), "/w/index.php?search=a");
    assert_eq!(req.headers()[header::HOST], "wiki.example");

    // Host normalised; a path already canonical keeps its URI.
    let mut req = request("GET", "/x", Version::HTTP_11, &["WIKI.example."]);
    let t = Target::of(&req, DEFAULT).unwrap();
    t.forward(&mut req);
    assert_eq!(req.headers()[header::HOST], "wiki.example");
    assert_eq!(req.uri(), "/x");

    // `Connection: host` removed Host before forwarding: it is put back.
    let mut req = request("GET", "/x", Version::HTTP_11, &["wiki.example"]);
    let t = Target::of(&req, DEFAULT).unwrap();
    req.headers_mut().remove(header::HOST);
    t.forward(&mut req);
    assert_eq!(req.headers()[header::HOST], "wiki.example");

    // HTTP/2: Host is made from `:authority`.
    let mut req = request("GET", "https://a.example:8443/x", Version::HTTP_2, &[]);
    let t = Target::of(&req, DEFAULT).unwrap();
    t.forward(&mut req);
    assert_eq!(req.headers()[header::HOST], "a.example:8443");
    assert_eq!(req.uri(), "/x");
}

#[test]
fn an_absolute_target_without_a_path_gets_one_before_its_query() {
    // Found by the canonical_target fuzz target: `?q` was forwarded as the
    // request target.
    for policy in [
        PathPolicy::default(),
        PathPolicy {
            keep_encoded_slash: true,
        },
    ] {
        let t = Target::parse("GET", "http://axhp?%73ea", None, policy).unwrap();
        assert_eq!(t.path_and_query(), "/?%73ea");
        assert_eq!((t.path(), t.query()), ("/", Some("%73ea")));
        assert!(t.rewritten());
        let t = Target::parse("GET", "http://a.example/x?y", None, policy).unwrap();
        assert_eq!(t.path_and_query(), "/x?y");
        assert!(!t.rewritten());
    }
}
