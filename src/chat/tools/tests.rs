use super::*;

#[test]
fn both_call_formats_parse_and_text_around_them_stays() {
    let answer = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Nantucket\", \"days\": 2}}\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n<parameter=offset>\n-5\n</parameter>\n</function>\n</tool_call>";
    let (text, calls) = parse(answer);
    assert_eq!(text, "Let me look.");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments, json!({"city": "Nantucket", "days": 2}));
    assert_eq!(calls[1].name, "get_time");
    assert_eq!(calls[1].arguments, json!({"zone": "UTC", "offset": -5}));
    // Arguments written as a JSON string are read as the object.
    let (_, calls) = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>");
    assert_eq!(calls[0].arguments, json!({"a": 1}));
}

#[test]
fn a_block_that_does_not_parse_stays_text() {
    for answer in [
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
        "a <tool_call> never closed",
        "<tool_call>{oops</tool_call>",
    ] {
        let (text, calls) = parse(answer);
        assert!(calls.is_empty(), "{answer}");
        assert_eq!(text, answer.trim(), "nothing the model wrote is lost");
    }
}

#[test]
fn streaming_in_any_pieces_gives_what_parsing_the_whole_gives() {
    let answer = "Sure <tool <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"<b>\"}}\n</tool_call> done <";
    let (whole_text, whole_calls) = parse(answer);
    for size in [1, 2, 3, 7, 100] {
        let mut s = CallStream::default();
        let mut text = String::new();
        let chars: Vec<char> = answer.chars().collect();
        for piece in chars.chunks(size) {
            text.push_str(&s.push(&piece.iter().collect::<String>()));
        }
        text.push_str(&s.finish());
        assert_eq!(text.trim(), whole_text, "pieces of {size}");
        assert_eq!(s.calls, whole_calls, "pieces of {size}");
    }
    assert_eq!(whole_text, "Sure <tool  done <");
    assert_eq!(whole_calls[0].arguments, json!({"x": "<b>"}));
}

#[test]
fn a_rendered_call_parses_back_in_both_formats() {
    let call = ToolCall { name: "book".into(), arguments: json!({"berth": 3, "ship": "Pequod"}) };
    for format in [CallFormat::Json, CallFormat::Xml] {
        let (text, calls) = parse(&call.render(format));
        assert_eq!((text.as_str(), calls), ("", vec![call.clone()]), "{format:?}");
    }
}

#[test]
fn a_named_choice_must_be_among_the_tools() {
    let uses = ToolUse {
        tools: vec![Tool { name: "f".into(), description: None, parameters: json!({"type": "object"}) }],
        choice: ToolChoice::Function("g".into()),
    };
    let e = grammar(&uses, CallFormat::Json).unwrap_err();
    assert!(e.contains("`g`"), "{e}");
    assert_eq!(grammar(&ToolUse { choice: ToolChoice::Auto, ..uses }, CallFormat::Json), Ok(None));
}

#[test]
fn feeding_a_stream_names_exactly_the_calls_each_piece_closed() {
    let call = |n: &str| format!("<tool_call>\n{{\"name\": \"{n}\", \"arguments\": {{}}}}\n</tool_call>");
    let pieces =
        [format!("a {}", &call("f")[..5]), format!("{} b ", &call("f")[5..]), call("g") + &call("h"), "c".into()];
    let mut s = CallStream::default();
    let mut new: Vec<Vec<String>> = Vec::new();
    for p in &pieces {
        let (_, first) = s.feed(p);
        new.push(s.calls[first..].iter().map(|c| c.name.clone()).collect());
    }
    assert_eq!(new, [vec![], vec!["f".to_owned()], vec!["g".to_owned(), "h".to_owned()], vec![]]);
}
