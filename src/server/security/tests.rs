use super::*;

#[test]
fn hosts() {
    let local = Policy::new("127.0.0.1:11435".parse().unwrap(), None, vec![], vec![]);
    for (host, ok) in [
        ("127.0.0.1:11435", true),
        ("localhost:11435", true),
        ("LOCALHOST", true),
        ("[::1]:11435", true),
        ("tauri.localhost", true),
        ("127.0.0.2", true),
        ("evil.example:11435", false),
        ("192.168.1.4:11435", false),
        ("localhost.evil.example", false),
    ] {
        assert_eq!(local.host_allowed(host), ok, "{host}");
    }
    let lan = Policy::new("0.0.0.0:11435".parse().unwrap(), Some("k".into()), vec!["mymac.local".into()], vec![]);
    assert!(lan.host_allowed("192.168.1.4:11435"));
    assert!(lan.host_allowed("mymac.local:11435"));
    assert!(!lan.host_allowed("evil.example"));
    assert!(lan.origin_allowed("http://192.168.1.4:11435"));
    assert!(lan.origin_allowed("http://mymac.local:11435"));
    assert!(!lan.origin_allowed("http://192.168.1.4:8080"));
    assert!(!lan.origin_allowed("http://evil.example:11435"));
}

#[test]
fn origins() {
    let p = Policy::new("127.0.0.1:8080".parse().unwrap(), None, vec![], vec!["http://localhost:5173".into()]);
    for (origin, ok) in [
        ("tauri://localhost", true),
        ("http://tauri.localhost", true),
        ("http://127.0.0.1:8080", true),
        ("http://localhost:8080/", true),
        ("http://localhost:5173", true),
        ("http://localhost:9999", false),
        ("https://evil.example", false),
        ("null", false),
    ] {
        assert_eq!(p.origin_allowed(origin), ok, "{origin}");
    }
}

#[test]
fn keys() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
    assert!(!constant_time_eq(b"", b"a"));
    assert!(constant_time_eq(b"", b""));
}
