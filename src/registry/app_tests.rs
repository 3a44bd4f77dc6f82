use std::path::PathBuf;

use super::*;
use crate::registry::{Registry, RegistryError, SettingsPatch};

const FILE: &str = r#"# My models
models_dir = "models"  # where they live
default = "a"

[[model]]
name = "a"   # the first
path = "a"
"#;

/// A folder with models.toml (`text`) and a model folder `a` (config.json and weights).
fn setup(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for m in ["a", "models/b"] {
        std::fs::create_dir_all(dir.path().join(m)).unwrap();
        std::fs::write(dir.path().join(m).join("config.json"), "{}").unwrap();
        std::fs::write(dir.path().join(m).join("model.safetensors"), "").unwrap();
    }
    let path = dir.path().join("models.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn patch(json: &str) -> AppPatch {
    serde_json::from_str(json).unwrap()
}

#[test]
fn defaults_when_the_file_says_nothing() {
    let (dir, path) = setup(FILE);
    let s = Registry::load(&path).unwrap().app_settings();
    assert_eq!(s.server, ServerView { port: DEFAULT_PORT, expose: false, api_key_set: false });
    assert_eq!(s.ui, UiSettings { theme: Theme::System, context_policy: ContextPolicy::Rolling });
    assert_eq!(s.models_dir, dir.path().join("models"));
    assert_eq!(s.conversations_dir, dir.path().join("conversations"));
    assert_eq!(s.default_model.as_deref(), Some("a"));
}

#[test]
fn a_change_is_saved_in_place_keeping_comments_and_read_back() {
    let (dir, path) = setup(FILE);
    let mut r = Registry::load(&path).unwrap();
    let p = patch(
        r#"{"default_model": "b", "conversations_dir": "chats",
            "server": {"port": 9000, "expose": true, "api_key": "k-123"},
            "ui": {"theme": "dark", "context_policy": "middle"}}"#,
    );
    let s = r.update_app(&p).unwrap();
    assert_eq!(s.default_model.as_deref(), Some("b"));
    assert_eq!(s.server, ServerView { port: 9000, expose: true, api_key_set: true });
    assert_eq!(s.ui, UiSettings { theme: Theme::Dark, context_policy: ContextPolicy::Middle });
    assert!(dir.path().join("chats").is_dir(), "the new conversations folder is created");
    let text = std::fs::read_to_string(&path).unwrap();
    for kept in ["# My models", "# where they live", "# the first"] {
        assert!(text.contains(kept), "{kept:?} lost:\n{text}");
    }
    // What a later start reads.
    let again = Registry::load(&path).unwrap();
    assert_eq!(again.app_settings(), s);
    assert_eq!(again.server().api_key.as_deref(), Some("k-123"));
    assert_eq!((again.server().host(), again.server().port()), ("0.0.0.0", 9000));
    // An empty key removes it, and with it the exposure must go too.
    let err = r.update_app(&patch(r#"{"server": {"api_key": ""}}"#)).unwrap_err().to_string();
    assert!(err.contains("server.expose"), "{err}");
    let s = r.update_app(&patch(r#"{"server": {"api_key": "", "expose": false}}"#)).unwrap();
    assert_eq!(s.server, ServerView { port: 9000, expose: false, api_key_set: false });
    assert!(!std::fs::read_to_string(&path).unwrap().contains("api_key"));
}

#[test]
fn bad_changes_are_named_and_write_nothing() {
    let (dir, path) = setup(FILE);
    let mut r = Registry::load(&path).unwrap();
    let cases = [
        (r#"{"server": {"expose": true}}"#, "server.expose = true"),
        (r#"{"server": {"port": 0}}"#, "server.port = 0"),
        (r#"{"server": {"api_key": " spaced "}}"#, "server.api_key"),
        (r#"{"default_model": "nope"}"#, "default = \"nope\" names no model (known: a, b)"),
        (r#"{"models_dir": "  "}"#, "models_dir"),
    ];
    for (json, expected) in cases {
        let err = r.update_app(&patch(json)).unwrap_err().to_string();
        assert!(err.contains(expected), "{json}: {err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), FILE, "{json} changed the file");
    }
    // A folder that cannot be made (a file is in the way) is named, and nothing is written.
    std::fs::write(dir.path().join("taken"), "").unwrap();
    let err = r.update_app(&patch(r#"{"models_dir": "taken/models"}"#)).unwrap_err();
    assert!(matches!(&err, RegistryError::Folder { field: "models_dir", .. }), "{err}");
    assert!(err.to_string().contains("taken"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), FILE);
    // Unknown keys and values are refused by the API's parser.
    assert!(serde_json::from_str::<AppPatch>(r#"{"ui": {"theme": "blue"}}"#).is_err());
    assert!(serde_json::from_str::<AppPatch>(r#"{"server": {"host": "x"}}"#).is_err());
}

#[test]
fn a_new_models_folder_is_created_and_scanned() {
    let (dir, path) = setup(FILE);
    let mut r = Registry::load(&path).unwrap();
    assert!(r.get("b").is_some());
    let s = r.update_app(&patch(r#"{"models_dir": "elsewhere"}"#)).unwrap();
    assert_eq!(s.models_dir, dir.path().join("elsewhere"));
    assert!(s.models_dir.is_dir());
    assert!(r.get("b").is_none(), "b lived in the old folder");
    assert!(r.get("a").is_some(), "configured models stay");
}

#[test]
fn bad_server_and_ui_tables_name_the_line() {
    let err = |text: &str| {
        let (_dir, path) = setup(text);
        Registry::load(&path).unwrap_err().to_string().replace(&path.display().to_string(), "models.toml")
    };
    let e = err(&format!("{FILE}\n[server]\nport = 80\nexpose = true\n"));
    assert!(e.starts_with("models.toml:11: server.expose = true: must be false unless server.api_key is set"), "{e}");
    let e = err(&format!("{FILE}\n[ui]\ntheme = \"blue\"\n"));
    assert!(e.contains(":10:") && e.contains("ui.theme") && e.contains("unknown variant `blue`"), "{e}");
    let e = err(&format!("{FILE}\n[server]\nport = 70000\n"));
    assert!(e.contains(":10:") && e.contains("server.port"), "{e}");
}

#[test]
fn a_models_system_prompt_is_set_and_removed() {
    let (_dir, path) = setup(FILE);
    let mut r = Registry::load(&path).unwrap();
    let set: SettingsPatch = serde_json::from_str(r#"{"system_prompt": "You are terse.\nAnswer in French."}"#).unwrap();
    let entry = r.update_settings("a", &set).unwrap();
    assert_eq!(entry.system_prompt.as_deref(), Some("You are terse.\nAnswer in French."));
    let again = Registry::load(&path).unwrap();
    assert_eq!(again.get("a").unwrap().system_prompt, entry.system_prompt);
    let clear: SettingsPatch = serde_json::from_str(r#"{"system_prompt": ""}"#).unwrap();
    assert_eq!(r.update_settings("a", &clear).unwrap().system_prompt, None);
    assert!(!std::fs::read_to_string(&path).unwrap().contains("system_prompt"));
}
