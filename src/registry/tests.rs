use super::*;
use tempfile::TempDir;

/// A folder holding models.toml with `text`.
fn registry_file(text: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("models.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn make_model_folder(dir: &Path, weights: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    if weights {
        std::fs::write(dir.join("model.safetensors"), "").unwrap();
    }
}

/// Temporary files left in a folder by a write.
fn leftovers(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned());
    names.filter(|n| n.starts_with(".models.toml.")).collect()
}

fn load_error(text: &str) -> String {
    let (_dir, path) = registry_file(text);
    let error = Registry::load(&path).unwrap_err().to_string();
    error.replace(&path.display().to_string(), "models.toml")
}

const MODELS: &str = r#"# My models
models_dir = "models"  # where they live
default = "a"

[[model]]
name = "a"   # the first
path = "/m/a"
mtp = { enabled = true, depth = 3 }  # drafting
sampling = { temperature = 0.7, top_p = 0.95, max_tokens = 512 }

[[model]]
name = "b"
path = "b"

[model.sampling]
temperature = 1.0 # hot
"#;

#[test]
fn the_depth_message_names_the_range_generation_checks() {
    assert_eq!(DEPTHS_EXPECTED, format!("in {}", crate::generate::MTP_DEPTHS_TEXT));
}

#[test]
fn repo_models_toml_names_the_bundled_model() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let registry = Registry::load(&root.join("models.toml")).unwrap();
    let tiny = registry.default_model().unwrap();
    assert_eq!(tiny.name, "tandem-tiny");
    assert_eq!(tiny.path, root.join("assets/models/tandem-tiny"));
    assert_eq!(tiny.source, ModelSource::Configured);
    assert_eq!(tiny.mtp, MtpSettings { enabled: true, depth: 3, adaptive: true });
    assert_eq!(tiny.sampling, SamplingSettings::default());
}

#[test]
fn defaults_fill_what_is_left_out() {
    let (_dir, path) = registry_file("[[model]]\nname = \"a\"\npath = \"/m/a\"\nsampling = { top_k = 20 }\n");
    let registry = Registry::load(&path).unwrap();
    let home = PathBuf::from(std::env::var_os("HOME").unwrap());
    assert_eq!(registry.models_dir(), home.join(".tandem/models"));
    assert_eq!(registry.conversations_dir(), home.join(".tandem/conversations"));
    let a = registry.default_model().unwrap();
    assert_eq!(a.mtp, MtpSettings { enabled: true, depth: 3, adaptive: true });
    let expected = SamplingSettings {
        temperature: 0.7,
        top_p: 0.95,
        top_k: 20,
        min_p: 0.0,
        repetition_penalty: 1.0,
        max_tokens: 512,
    };
    assert_eq!(a.sampling, expected);
}

#[test]
fn paths_expand_home_and_resolve_against_the_file() {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap());
    assert_eq!(expand_home("~"), home);
    assert_eq!(expand_home("~/.tandem/models"), home.join(".tandem/models"));
    assert_eq!(expand_home("~other/x"), PathBuf::from("~other/x"));
    assert_eq!(expand_home("/abs/~"), PathBuf::from("/abs/~"));

    let (dir, path) = registry_file(MODELS);
    let registry = Registry::load(&path).unwrap();
    assert_eq!(registry.models_dir(), dir.path().join("models"));
    assert_eq!(registry.conversations_dir(), dir.path().join("conversations"), "beside the models folder");
    assert_eq!(registry.get("a").unwrap().path, PathBuf::from("/m/a"));
    assert_eq!(registry.get("b").unwrap().path, dir.path().join("b"));

    for (setting, expected) in [
        ("chats", dir.path().join("chats")),
        ("~/.tandem/chats", home.join(".tandem/chats")),
        ("/var/chats", PathBuf::from("/var/chats")),
    ] {
        std::fs::write(&path, format!("conversations_dir = \"{setting}\"\n{MODELS}")).unwrap();
        assert_eq!(Registry::load(&path).unwrap().conversations_dir(), expected, "{setting}");
    }
    std::fs::write(&path, format!("conversations_dir = \" \"\n{MODELS}")).unwrap();
    let err = Registry::load(&path).unwrap_err().to_string();
    assert!(err.contains("conversations_dir") && err.contains("empty"), "{err}");
    std::fs::write(&path, format!("conversations_dir = 3\n{MODELS}")).unwrap();
    let err = Registry::load(&path).unwrap_err().to_string();
    assert!(err.contains("1: conversations_dir"), "{err}");
}

#[test]
fn list_adds_scanned_folders_and_configured_entries_win() {
    let (dir, path) = registry_file(MODELS);
    let models = dir.path().join("models");
    make_model_folder(&models.join("z-converted"), true);
    make_model_folder(&models.join("c-converted"), true);
    make_model_folder(&models.join("a"), true); // hidden by the configured "a"
    make_model_folder(&models.join("no-weights"), false);
    std::fs::write(models.join("stray.txt"), "").unwrap();
    let registry = Registry::load(&path).unwrap();
    let listed: Vec<(String, ModelSource)> = registry.list().into_iter().map(|m| (m.name, m.source)).collect();
    let expected = [
        ("a", ModelSource::Configured),
        ("b", ModelSource::Configured),
        ("c-converted", ModelSource::Scanned),
        ("z-converted", ModelSource::Scanned),
    ];
    assert_eq!(listed, expected.map(|(n, s)| (n.to_owned(), s)));
    let c = registry.get("c-converted").unwrap();
    assert_eq!(
        (c.path, c.mtp, c.sampling),
        (models.join("c-converted"), MtpSettings::default(), SamplingSettings::default())
    );
}

#[test]
fn resolve_takes_a_name_or_a_model_folder() {
    let (dir, path) = registry_file(MODELS);
    make_model_folder(&dir.path().join("b"), true);
    make_model_folder(&dir.path().join("elsewhere/x"), true);
    make_model_folder(&dir.path().join("half"), false);
    let registry = Registry::load(&path).unwrap();
    assert_eq!(registry.resolve("a").unwrap().path, PathBuf::from("/m/a"));
    // The path of a configured model is that model, with its settings.
    let b = registry.resolve(&format!("{}/./b", dir.path().display())).unwrap();
    assert_eq!((b.name.as_str(), b.source, b.sampling.temperature), ("b", ModelSource::Configured, 1.0));
    let x = registry.resolve(dir.path().join("elsewhere/x").to_str().unwrap()).unwrap();
    assert_eq!((x.name.as_str(), x.source), ("x", ModelSource::Path));

    let error = registry.resolve("nope").unwrap_err().to_string();
    assert_eq!(error, "no model named `nope` and no model folder at that path (known: a, b)");
    let half = dir.path().join("half");
    let error = registry.resolve(half.to_str().unwrap()).unwrap_err().to_string();
    assert_eq!(error, format!("{}: not a model folder (it needs config.json and *.safetensors)", half.display()));
}

#[test]
fn default_model_is_the_first_when_unset() {
    let (_dir, path) =
        registry_file("[[model]]\nname = \"first\"\npath = \"f\"\n[[model]]\nname = \"second\"\npath = \"s\"\n");
    assert_eq!(Registry::load(&path).unwrap().default_model().unwrap().name, "first");
    let (_dir, path) = registry_file("models_dir = \"empty\"\n");
    let error = Registry::load(&path).unwrap().default_model().unwrap_err().to_string();
    let expected = format!("no model configured and none found in {}", path.with_file_name("empty").display());
    assert!(error.ends_with(&expected), "{error}");
}

#[test]
fn update_keeps_comments_and_layout() {
    let (dir, path) = registry_file(MODELS);
    let mut registry = Registry::load(&path).unwrap();
    let patch = SettingsPatch {
        mtp: MtpPatch { depth: Some(2), ..Default::default() },
        sampling: SamplingPatch { temperature: Some(0.2), top_k: Some(40), ..Default::default() },
        system_prompt: None,
    };
    let a = registry.update_settings("a", &patch).unwrap();
    assert_eq!((a.mtp.depth, a.sampling.temperature, a.sampling.top_k, a.sampling.top_p), (2, 0.2, 40, 0.95));
    let patch = SettingsPatch {
        mtp: MtpPatch { enabled: Some(false), ..Default::default() },
        sampling: SamplingPatch { temperature: Some(0.5), ..Default::default() },
        system_prompt: None,
    };
    registry.update_settings("b", &patch).unwrap();
    let expected = MODELS
        .replace("depth = 3 }  # drafting", "depth = 2 }  # drafting")
        .replace(
            "temperature = 0.7, top_p = 0.95, max_tokens = 512 }",
            "temperature = 0.2, top_p = 0.95, max_tokens = 512, top_k = 40 }",
        )
        .replace("path = \"b\"\n", "path = \"b\"\nmtp = { enabled = false }\n")
        .replace("temperature = 1.0 # hot", "temperature = 0.5 # hot");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);
    assert!(leftovers(dir.path()).is_empty());

    // What was written reads back the same.
    let reloaded = Registry::load(&path).unwrap();
    assert_eq!(reloaded.list(), registry.list());
    let b = reloaded.get("b").unwrap();
    assert_eq!((b.mtp.enabled, b.sampling.temperature), (false, 0.5));
}

#[test]
fn update_adds_an_entry_for_a_scanned_model() {
    let (dir, path) = registry_file(MODELS);
    make_model_folder(&dir.path().join("models/q-4bit"), true);
    let mut registry = Registry::load(&path).unwrap();
    let patch = SettingsPatch { mtp: MtpPatch { depth: Some(1), ..Default::default() }, ..Default::default() };
    let q = registry.update_settings("q-4bit", &patch).unwrap();
    assert_eq!((q.source, q.mtp.depth, q.path), (ModelSource::Configured, 1, dir.path().join("models/q-4bit")));
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text,
        format!("{MODELS}\n[[model]]\nname = \"q-4bit\"\npath = \"models/q-4bit\"\nmtp = {{ depth = 1 }}\n")
    );

    let error = registry.update_settings("ghost", &patch).unwrap_err().to_string();
    assert_eq!(error, "no model named `ghost` and no model folder at that path (known: a, b, q-4bit)");
}

#[test]
fn update_keeps_hand_edits_made_since_loading() {
    let (_dir, path) = registry_file(MODELS);
    let mut registry = Registry::load(&path).unwrap();
    std::fs::write(&path, MODELS.replace("# My models", "# My models, edited")).unwrap();
    let patch =
        SettingsPatch { sampling: SamplingPatch { max_tokens: Some(64), ..Default::default() }, ..Default::default() };
    registry.update_settings("a", &patch).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# My models, edited\n") && text.contains("max_tokens = 64 }"), "{text}");
}

#[test]
fn invalid_update_writes_nothing() {
    let (dir, path) = registry_file(MODELS);
    let mut registry = Registry::load(&path).unwrap();
    let patch = SettingsPatch { mtp: MtpPatch { depth: Some(9), ..Default::default() }, ..Default::default() };
    let error = registry.update_settings("a", &patch).unwrap_err().to_string();
    assert_eq!(error, format!("{}: model `a`: mtp.depth = 9: must be in 1..=8", path.display()));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), MODELS);
    assert!(leftovers(dir.path()).is_empty());
    assert_eq!(registry.get("a").unwrap().mtp.depth, 3);
}

#[test]
fn failed_write_keeps_the_old_file_and_leaves_no_temporary() {
    // The rename fails (the target is a non-empty folder), whoever runs the test.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("models.toml");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), "x").unwrap();
    let error = write_atomic(&target, "new").unwrap_err().to_string();
    assert!(error.starts_with(&format!("cannot write {}: ", target.display())), "{error}");
    assert!(target.join("keep").is_file());
    assert!(leftovers(dir.path()).is_empty());

    // A read-only folder: the temporary file cannot be created.
    use std::os::unix::fs::PermissionsExt;
    let (dir, path) = registry_file(MODELS);
    let mut registry = Registry::load(&path).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let root_ignores_permissions = std::fs::write(dir.path().join("probe"), "").is_ok();
    let patch = SettingsPatch { mtp: MtpPatch { depth: Some(2), ..Default::default() }, ..Default::default() };
    let result = registry.update_settings("a", &patch);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if root_ignores_permissions {
        eprintln!("skipped the read-only folder case: running as root, which ignores permissions");
        return;
    }
    let error = result.unwrap_err().to_string();
    assert!(error.starts_with(&format!("cannot write {}", path.display())), "{error}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), MODELS);
    assert!(leftovers(dir.path()).is_empty());
    assert_eq!(registry.get("a").unwrap().mtp.depth, 3, "the registry is unchanged too");
}

#[test]
fn writing_through_a_symlink_keeps_the_link() {
    let (dir, path) = registry_file(MODELS);
    let link = dir.path().join("link.toml");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let mut registry = Registry::load(&link).unwrap();
    let patch = SettingsPatch { mtp: MtpPatch { depth: Some(4), ..Default::default() }, ..Default::default() };
    registry.update_settings("a", &patch).unwrap();
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert!(std::fs::read_to_string(&path).unwrap().contains("depth = 4 }"));
}

#[test]
fn bad_files_are_named() {
    let model = "[[model]]\nname = \"a\"\npath = \"a\"\n";
    let cases = [
            ("models_dirr = \"x\"\n".to_owned(), "models.toml:1: unknown field `models_dirr`, expected one of `models_dir`, `conversations_dir`, `default`, `model`, `catalog`, `server`, `ui`"),
            (format!("{model}colour = 1\n"), "models.toml:4: model[0]: unknown field `colour`, expected one of `name`, `path`, `mtp`, `sampling`, `prefix_cache_bytes`, `batch`, `prefix_cache_disk`, `system_prompt`"),
            (format!("{model}mtp = {{ depht = 2 }}\n"), "models.toml:4: model[0].mtp: unknown field `depht`, expected one of `enabled`, `depth`, `adaptive`"),
            (format!("{model}mtp = {{ depth = \"3\" }}\n"), "models.toml:4: model[0].mtp.depth: invalid type: string \"3\", expected u32"),
            (format!("{model}mtp = {{ depth = -1 }}\n"), "models.toml:4: model[0].mtp.depth: invalid value: integer `-1`, expected u32"),
            (format!("{model}sampling = {{ temperature = \"hot\" }}\n"), "models.toml:4: model[0].sampling.temperature: invalid type: string \"hot\", expected f32"),
            (format!("{model}mtp = {{ depth = 0 }}\n"), "models.toml:4: model `a`: mtp.depth = 0: must be in 1..=8"),
            (format!("{model}mtp = {{ depth = 9 }}\n"), "models.toml:4: model `a`: mtp.depth = 9: must be in 1..=8"),
            (format!("{model}sampling = {{ top_p = 1.5 }}\n"), "models.toml:4: model `a`: sampling.top_p = 1.5: must be in (0, 1]"),
            (format!("{model}sampling = {{ temperature = -0.5 }}\n"), "models.toml:4: model `a`: sampling.temperature = -0.5: must be in [0, 10]"),
            (format!("{model}sampling = {{ max_tokens = 0 }}\n"), "models.toml:4: model `a`: sampling.max_tokens = 0: must be 1 or more"),
            (format!("{model}{model}"), "models.toml:5: model `a` is defined twice (first at line 2)"),
            (format!("default = \"b\"\nmodels_dir = \"none\"\n{model}"), "models.toml:1: default = \"b\" names no model (known: a)"),
            ("[[model]]\nname = \"a\"\n".to_owned(), "models.toml:1: model[0]: missing field `path`"),
            (format!("{model}\n[model.sampling]\nrepetition_penalty = 0.0\n"), "models.toml:6: model `a`: sampling.repetition_penalty = 0: must be in [0.1, 10]"),
            (format!("{model}{model}[[model]]\nname = \"b\"\npath = \"b\"\nsampling = {{ top_p = 2.0 }}\n"), "models.toml:5: model `a` is defined twice (first at line 2)"),
            (format!("[[model]]\nname = \"x\"\npath = \"x\"\n{model}[[model]]\nname = \"b\"\npath = \"b\"\nsampling = {{ top_p = 2.0 }}\n"), "models.toml:10: model `b`: sampling.top_p = 2: must be in (0, 1]"),
            ("[[model]]\nname = \"\"\npath = \"a\"\n".to_owned(), "models.toml:2: model ``: the name is empty"),
            ("model = 3\n".to_owned(), "models.toml:1: model: invalid type: integer `3`, expected a sequence"),
            ("default = \n".to_owned(), "models.toml:1: string values must be quoted, expected literal string"),
        ];
    for (text, expected) in cases {
        assert_eq!(load_error(&text), expected, "for:\n{text}");
    }
    let error = Registry::load(Path::new("/nonexistent/models.toml")).unwrap_err().to_string();
    assert_eq!(error, "/nonexistent/models.toml: No such file or directory (os error 2)");
}

#[test]
fn settings_patch_reads_json_and_rejects_unknown_keys() {
    let patch: SettingsPatch =
        serde_json::from_str(r#"{"mtp": {"depth": 2}, "sampling": {"temperature": 0.3}}"#).unwrap();
    assert_eq!((patch.mtp.depth, patch.mtp.enabled, patch.sampling.temperature), (Some(2), None, Some(0.3)));
    let error = serde_json::from_str::<SettingsPatch>(r#"{"sampling": {"temprature": 0.3}}"#).unwrap_err().to_string();
    assert!(error.starts_with("unknown field `temprature`"), "{error}");
}

#[test]
fn sampling_settings_have_sane_ranges() {
    let ok = SamplingSettings::default();
    ok.check().unwrap();
    let cases = [
        (
            SamplingSettings { repetition_penalty: 1e-45, ..ok },
            "sampling.repetition_penalty = 1e-45: must be in [0.1, 10]",
        ),
        (
            SamplingSettings { repetition_penalty: 1e9, ..ok },
            "sampling.repetition_penalty = 1000000000: must be in [0.1, 10]",
        ),
        (SamplingSettings { temperature: 1e30, ..ok }, "sampling.temperature = 1e30: must be in [0, 10]"),
        (SamplingSettings { temperature: f32::NAN, ..ok }, "sampling.temperature = NaN: must be in [0, 10]"),
        (SamplingSettings { top_p: 0.0, ..ok }, "sampling.top_p = 0: must be in (0, 1]"),
        (SamplingSettings { min_p: -0.1, ..ok }, "sampling.min_p = -0.1: must be in [0, 1]"),
        (SamplingSettings { max_tokens: 0, ..ok }, "sampling.max_tokens = 0: must be 1 or more"),
    ];
    for (settings, expected) in cases {
        assert_eq!(settings.check().unwrap_err().to_string(), expected);
    }
    // The ends of each range are in it.
    SamplingSettings { temperature: 0.0, top_p: 1.0, min_p: 1.0, repetition_penalty: 0.1, ..ok }.check().unwrap();
    SamplingSettings { temperature: 10.0, min_p: 0.0, repetition_penalty: 10.0, ..ok }.check().unwrap();

    // A patch is checked alone with the same ranges, and update_settings writes nothing.
    let patch = SettingsPatch {
        sampling: SamplingPatch { repetition_penalty: Some(1e-45), ..Default::default() },
        ..Default::default()
    };
    assert_eq!(patch.check().unwrap_err().to_string(), "sampling.repetition_penalty = 1e-45: must be in [0.1, 10]");
    let (_dir, path) = registry_file(MODELS);
    let mut registry = Registry::load(&path).unwrap();
    let error = registry.update_settings("a", &patch).unwrap_err().to_string();
    assert!(error.ends_with("model `a`: sampling.repetition_penalty = 1e-45: must be in [0.1, 10]"), "{error}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), MODELS);
}

#[test]
fn model_paths_are_checked_naming_the_line() {
    let text = "[[model]]\nname = \"a\"\npath = \"a\"\n\n[[model]]\nname = \"b\"\npath = \"b\"\n";
    let (dir, path) = registry_file(text);
    // Loading does not look at the folders (the CLI and tests name folders made later); a server
    // checks them when it starts.
    let registry = Registry::load(&path).unwrap();
    let error = registry.check_model_paths().unwrap_err().to_string();
    assert_eq!(error, format!("{}:3: model `a`: {} does not exist", path.display(), dir.path().join("a").display()));
    make_model_folder(&dir.path().join("a"), true);
    make_model_folder(&dir.path().join("b"), false);
    let error = registry.check_model_paths().unwrap_err().to_string();
    let b = dir.path().join("b");
    let expected = "is not a model folder (it needs config.json and *.safetensors)";
    assert_eq!(error, format!("{}:7: model `b`: {} {expected}", path.display(), b.display()));
    make_model_folder(&b, true);
    registry.check_model_paths().unwrap();
}

#[test]
fn os_errors_are_printed_once() {
    // Printed as the binaries print errors, with their causes.
    let error = anyhow::Error::from(Registry::load(Path::new("/nonexistent/models.toml")).unwrap_err());
    assert_eq!(format!("{error:#}"), "/nonexistent/models.toml: No such file or directory (os error 2)");
}

#[test]
fn catalogue_entries_of_models_toml_join_the_builtin_ones_and_bad_ones_name_the_field() {
    let (_dir, path) = registry_file(
        "[[catalog]]\nrepo = \"me/Qwen3.5-9B-5bit\"\nformat = \"mlx\"\nparams_b = 9.0\nbits = 5\nmtp = false\nbase = \"Qwen/Qwen3.5-9B\"\n",
    );
    let r = Registry::load(&path).unwrap();
    assert_eq!(r.catalog().len(), catalog::builtin().len() + 1);
    let mine = r.catalog().last().unwrap();
    assert_eq!(
        (mine.repo.as_str(), mine.bits, mine.base.as_deref()),
        ("me/Qwen3.5-9B-5bit", 5, Some("Qwen/Qwen3.5-9B"))
    );
    // Without entries of its own: the built-in catalogue.
    assert_eq!(Registry::load(&registry_file("").1).unwrap().catalog(), &catalog::builtin()[..]);

    let e = load_error("[[catalog]]\nrepo = \"me/x\"\nformat = \"mlx\"\nparams_b = 9.0\nbits = 12\nmtp = false\n");
    assert_eq!(e, "models.toml: [[catalog]] entry `me/x`: bits = 12: must be 2 to 8, or 16 for bf16");
    let e = load_error("[[catalog]]\nrepo = \"me/x\"\nformat = \"gguf\"\nparams_b = 9.0\nbits = 4\nmtp = false\n");
    assert!(e.contains("format") && e.contains("gguf"), "{e}");
    let e =
        load_error("[[catalog]]\nrepo = \"me/x\"\nformat = \"mlx\"\nparams_b = 9.0\nbits = 4\nmtp = false\nsize = 3\n");
    assert!(e.contains("size"), "an unknown key is named: {e}");
}

#[test]
fn the_user_config_is_seeded_from_the_defaults_and_changes_never_reach_them() {
    let dir = tempfile::tempdir().unwrap();
    let checkout = dir.path().join("checkout");
    make_model_folder(&checkout.join("assets/tiny"), true);
    let defaults = checkout.join("models.toml");
    let text = "models_dir = \"models\"   # scanned\ndefault = \"tiny\"\n[[model]]\nname = \"tiny\"\npath = \"assets/tiny\"  # bundled\nmtp = { enabled = true, depth = 3 }\n";
    std::fs::write(&defaults, text).unwrap();
    let user = user_config_path(&dir.path().join("home"));
    seed_user_config(&defaults, &user).unwrap();
    // The same models at the same places, read from the user's file; comments kept.
    let (d, u) = (Registry::load(&defaults).unwrap(), Registry::load(&user).unwrap());
    assert_eq!(u.models_dir(), checkout.canonicalize().unwrap().join("models"));
    assert_eq!(
        u.get("tiny").unwrap().path.canonicalize().unwrap(),
        d.get("tiny").unwrap().path.canonicalize().unwrap()
    );
    let written = std::fs::read_to_string(&user).unwrap();
    assert!(written.contains("# bundled") && written.contains("# scanned"), "{written}");
    assert!(written.starts_with("# Your Tandem settings, first written from"), "{written}");
    // A change goes to the user's file; the defaults stay byte for byte.
    let mut r = Registry::load(&user).unwrap();
    let patch = SettingsPatch { mtp: MtpPatch { depth: Some(2), ..Default::default() }, ..Default::default() };
    r.update_settings("tiny", &patch).unwrap();
    assert_eq!(Registry::load(&user).unwrap().get("tiny").unwrap().mtp.depth, 2);
    assert_eq!(std::fs::read_to_string(&defaults).unwrap(), text);
    // Seeding again keeps what the user has.
    seed_user_config(&defaults, &user).unwrap();
    assert_eq!(Registry::load(&user).unwrap().get("tiny").unwrap().mtp.depth, 2);
    // Defaults that do not load write nothing.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "models_dirr = 1\n").unwrap();
    let other = user_config_path(&dir.path().join("home2"));
    assert!(seed_user_config(&bad, &other).is_err() && !other.exists());
}

/// `tandem` run in the checkout finds the defaults as the bare name "models.toml" (its parent is
/// the empty path): the seeded user file must still hold absolute paths into the checkout, not
/// paths that would now be read relative to ~/.tandem (every later command then said "model
/// folder not found").
#[test]
fn seeding_from_a_bare_file_name_writes_absolute_paths() {
    let home = tempfile::tempdir().unwrap();
    let user = user_config_path(home.path());
    // Unit tests run in the package's folder, which holds the checkout's models.toml.
    seed_user_config(Path::new("models.toml"), &user).unwrap();
    let r = Registry::load(&user).unwrap();
    let tiny = r.get("tandem-tiny").expect("the bundled model's entry");
    assert!(tiny.path.is_absolute(), "{}", tiny.path.display());
    assert!(tiny.path.join("config.json").is_file(), "{} is not the bundled model", tiny.path.display());
}
