use super::StopMatcher;

/// Feeds `pieces` one by one; returns the released text and the matched stop.
fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
    let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
    let mut m = StopMatcher::new(&stops);
    let mut out = String::new();
    for p in pieces {
        out.push_str(&m.push(p));
    }
    if m.matched().is_none() {
        out.push_str(&m.finish());
    }
    (out, m.matched().map(str::to_owned))
}

/// (stop sequences, pieces of text, released text, matched stop)
type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a str, Option<&'a str>);

#[test]
fn table() {
    let cases: &[Case] = &[
        (&[], &["Hello", " world"], "Hello world", None),
        (&["END"], &["abc", "EN", "D tail"], "abc", Some("END")),
        (&["END"], &["abcEND"], "abc", Some("END")),
        (&["END"], &["abc", "EN", "X"], "abcENX", None),
        (&["END"], &["E", "N"], "EN", None),
        // The earliest match wins, whichever stop it is.
        (&["world", "lo w"], &["hello world"], "hel", Some("lo w")),
        // A stop spanning many pieces, one byte each.
        (&["\n\n"], &["a", "\n", "b", "\n", "\n", "c"], "a\nb", Some("\n\n")),
        // Multi-byte characters: holding back never splits a character.
        (&["ééX"], &["aé", "é", "Y"], "aééY", None),
        (&["ééX"], &["aé", "é", "X"], "a", Some("ééX")),
        (&["", "x"], &["abx"], "ab", Some("x")),
    ];
    for (stops, pieces, text, matched) in cases {
        let (got, got_match) = run(stops, pieces);
        assert_eq!(got, *text, "stops {stops:?}, pieces {pieces:?}");
        assert_eq!(got_match.as_deref(), *matched, "stops {stops:?}, pieces {pieces:?}");
    }
}

#[test]
fn releases_early_when_no_stop_can_start() {
    let mut m = StopMatcher::new(&["STOP".to_string()]);
    assert_eq!(m.push("abc"), "abc");
    assert_eq!(m.push("xS"), "x");
    assert_eq!(m.push("T"), "");
    assert_eq!(m.push("x"), "STx");
}
