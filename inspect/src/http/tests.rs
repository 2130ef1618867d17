//! Request head reader tests: heads captured on loopback from curl 7.88 and
//! wget 1.21 (see `testdata/http/README.md`) and crafted cases.

use super::*;

const CURL: &[u8] = include_bytes!("../../testdata/http/curl-http-plain.bin");
const WGET: &[u8] = include_bytes!("../../testdata/http/wget-http.bin");
const CURL_PROXY: &[u8] = include_bytes!("../../testdata/http/curl-proxy-abs.bin");

fn read(bytes: &[u8]) -> Progress {
    RequestHeadReader::default().push(bytes)
}

fn read_chunked(bytes: &[u8], step: usize) -> Progress {
    let mut reader = RequestHeadReader::default();
    for chunk in bytes.chunks(step) {
        let progress = reader.push(chunk);
        if progress != Progress::NeedMore {
            return progress;
        }
    }
    Progress::NeedMore
}

fn done(progress: Progress) -> RequestHead {
    match progress {
        Progress::Done(head) => head,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn rejected(progress: Progress) -> Reject {
    match progress {
        Progress::Reject(reject) => reject,
        other => panic!("expected Reject, got {other:?}"),
    }
}

#[test]
fn real_curl_head() {
    let head = done(read(CURL));
    assert_eq!(head.method, "GET");
    assert_eq!(head.target, "/path?q=1");
    assert_eq!(head.host, Host::Name("www.example.com".into()));
    assert_eq!(head.port, Some(18443));
    assert_eq!(head.version, 1);
    assert_eq!(head.head_len, CURL.len());
    assert_eq!(head.raw, CURL);
}

#[test]
fn real_wget_head_with_ip_host() {
    let head = done(read(WGET));
    assert_eq!(head.host, Host::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(head.port, Some(18443));
    assert_eq!(head.target, "/index.html");
}

#[test]
fn real_absolute_form_matching_host() {
    let head = done(read(CURL_PROXY));
    assert_eq!(head.target, "http://proxied.example.org/x");
    assert_eq!(head.host, Host::Name("proxied.example.org".into()));
    assert_eq!(head.port, None);
}

#[test]
fn one_byte_segments() {
    for bytes in [CURL, WGET, CURL_PROXY] {
        assert_eq!(done(read_chunked(bytes, 1)), done(read(bytes)));
    }
    let mut reader = RequestHeadReader::default();
    assert_eq!(reader.push(&CURL[..CURL.len() - 1]), Progress::NeedMore);
    assert!(matches!(
        reader.push(&CURL[CURL.len() - 1..]),
        Progress::Done(_)
    ));
    assert_eq!(reader.push(b"x"), Progress::Reject(Reject::Malformed));
}

#[test]
fn body_bytes_are_kept_for_replay() {
    let bytes = b"POST /u HTTP/1.1\r\nHost: a.example\r\nContent-Length: 4\r\n\r\nbody";
    let head = done(read(bytes));
    assert_eq!(head.raw, bytes);
    assert_eq!(head.head_len, bytes.len() - 4);
}

#[test]
fn host_rules() {
    let cases: [(&[u8], Reject); 9] = [
        (b"GET / HTTP/1.1\r\n\r\n", Reject::HostAbsent),
        (b"GET / HTTP/1.0\r\nAccept: */*\r\n\r\n", Reject::HostAbsent),
        (
            b"GET / HTTP/1.1\r\nHost: a.example\r\nhost: b.example\r\n\r\n",
            Reject::HostMultiple,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a.example\r\nHOST: a.example\r\n\r\n",
            Reject::HostMultiple,
        ),
        (b"GET / HTTP/1.1\r\nHost: \r\n\r\n", Reject::Malformed),
        (
            b"GET / HTTP/1.1\r\nHost: a.example, b.example\r\n\r\n",
            Reject::Malformed,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: user@a.example\r\n\r\n",
            Reject::Malformed,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a.example:99999\r\n\r\n",
            Reject::Malformed,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: b\xc3\xbccher.example\r\n\r\n",
            Reject::Malformed,
        ),
    ];
    for (bytes, reject) in cases {
        assert_eq!(
            rejected(read(bytes)),
            reject,
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn host_forms() {
    let head = done(read(b"GET / HTTP/1.1\r\nHost: WWW.Example.COM.\r\n\r\n"));
    assert_eq!(head.host.to_string(), "www.example.com");
    let head = done(read(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n\r\n"));
    assert_eq!(head.host, Host::V6("2001:db8::1".parse().unwrap()));
    assert_eq!(head.port, Some(8080));
    assert_eq!(head.host.to_string(), "[2001:db8::1]");
    let head = done(read(b"GET / HTTP/1.0\r\nHost:a.example\r\n\r\n"));
    assert_eq!(head.version, 0);
    // Bare LF line endings are accepted by httparse.
    let head = done(read(b"GET / HTTP/1.1\nHost: lf.example\n\n"));
    assert_eq!(head.host, Host::Name("lf.example".into()));
}

#[test]
fn connect_is_refused() {
    let bytes = b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n";
    assert_eq!(rejected(read(bytes)), Reject::Connect);
    assert_eq!(Reject::Connect.reason(), "http_connect");
}

#[test]
fn absolute_form_must_agree_with_host() {
    let mismatch = b"GET http://evil.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n";
    assert_eq!(rejected(read(mismatch)), Reject::HostMismatch);
    let port = b"GET http://a.example:8080/ HTTP/1.1\r\nHost: a.example\r\n\r\n";
    assert_eq!(rejected(read(port)), Reject::HostMismatch);
    let explicit_default = b"GET http://a.example:80/ HTTP/1.1\r\nHost: A.example\r\n\r\n";
    assert!(matches!(read(explicit_default), Progress::Done(_)));
    let https = b"GET https://a.example/x?y HTTP/1.1\r\nHost: a.example:443\r\n\r\n";
    assert!(matches!(read(https), Progress::Done(_)));
    let ftp = b"GET ftp://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n";
    assert_eq!(rejected(read(ftp)), Reject::Malformed);
    let authority_form = b"GET a.example:80 HTTP/1.1\r\nHost: a.example\r\n\r\n";
    assert_eq!(rejected(read(authority_form)), Reject::Malformed);
    let star = b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n";
    assert!(matches!(read(star), Progress::Done(_)));
    let star_get = b"GET * HTTP/1.1\r\nHost: a.example\r\n\r\n";
    assert_eq!(rejected(read(star_get)), Reject::Malformed);
}

#[test]
fn malformed_and_too_large() {
    for bytes in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"[..],
        b"GET / HTTP/2.0\r\nHost: a.example\r\n\r\n",
        b"GET /\r\n\r\n",
        b"G E T / HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        assert_eq!(rejected(read(bytes)), Reject::Malformed, "{bytes:?}");
    }
    let mut big = b"GET / HTTP/1.1\r\nHost: a.example\r\nX-Pad: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 20_000));
    assert_eq!(rejected(read_chunked(&big, 1000)), Reject::TooLarge);
    // Exactly at the bound without an end: too large, not NeedMore.
    let mut reader = RequestHeadReader::new(64);
    assert_eq!(reader.push(&[b'a'; 64]), Progress::Reject(Reject::TooLarge));
    // More than MAX_HEADERS headers.
    let mut many = b"GET / HTTP/1.1\r\nHost: a.example\r\n".to_vec();
    for i in 0..MAX_HEADERS {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(rejected(read(&many)), Reject::Malformed);
}

#[test]
fn mutations_never_panic() {
    for base in [CURL, WGET, CURL_PROXY] {
        for i in 0..base.len() {
            for value in [0x00, b'\n', b':', b'[', 0xff] {
                let mut bytes = base.to_vec();
                bytes[i] = value;
                let _ = read(&bytes);
                let _ = read_chunked(&bytes, 3);
            }
        }
    }
}
