//! Where the app finds models.toml and the web UI: in a checkout (development), or in the app
//! bundle's resources with the registry in the person's home folder.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The registry and UI the server is started with.
#[derive(Debug, Clone, PartialEq)]
pub struct Locations {
    pub models_toml: PathBuf,
    /// The built UI; `None` leaves it to `ServeConfig` (`TANDEM_UI_DIR`, else the checkout's `ui/dist`).
    pub ui_dir: Option<PathBuf>,
}

/// What the choice depends on, gathered so that tests need not change the process's environment.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `TANDEM_CONFIG`
    pub config_env: Option<PathBuf>,
    /// `TANDEM_UI_DIR` is set.
    pub ui_env: bool,
    pub exe: Option<PathBuf>,
    pub home: Option<PathBuf>,
    /// The bundle's resources (`Tandem.app/Contents/Resources`), or the executable's folder in a
    /// development build.
    pub resources: Option<PathBuf>,
}

impl Environment {
    pub fn from_process(resources: Option<&Path>) -> Environment {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Environment {
            config_env: var("TANDEM_CONFIG"),
            ui_env: var("TANDEM_UI_DIR").is_some(),
            exe: std::env::current_exe().ok(),
            home: var("HOME").or_else(|| var("USERPROFILE")),
            resources: resources.map(Path::to_path_buf),
        }
    }
}

impl Locations {
    pub fn resolve(resources: Option<&Path>) -> anyhow::Result<Locations> {
        Locations::resolve_in(&Environment::from_process(resources))
    }

    /// models.toml, as the CLI finds it: `$TANDEM_CONFIG`, else the user's `~/.tandem/models.toml`.
    /// Where it does not exist yet it is written on first start: from the checkout the executable was
    /// built in (`target/<profile>/` sits in it), whose models.toml is then only read (without a home
    /// folder that can be written, the checkout's file itself), or, for a bundled app, naming the model
    /// the bundle carries.
    /// The UI: `$TANDEM_UI_DIR`, else the bundle's `ui/dist`, else the checkout's.
    pub fn resolve_in(cx: &Environment) -> anyhow::Result<Locations> {
        let ui_dir = match (&cx.resources, cx.ui_env) {
            (Some(res), false) if res.join("ui/dist/index.html").is_file() => Some(res.join("ui/dist")),
            _ => None,
        };
        if let Some(path) = &cx.config_env {
            return Ok(Locations { models_toml: path.clone(), ui_dir });
        }
        let user = cx.home.as_deref().map(tandem::registry::user_config_path);
        if let Some(user) = user.as_ref().filter(|u| u.is_file()) {
            return Ok(Locations { models_toml: user.clone(), ui_dir });
        }
        let checkout = cx
            .exe
            .iter()
            .flat_map(|exe| exe.ancestors().skip(1).take(4))
            .map(|d| d.join("models.toml"))
            .find(|p| p.is_file());
        if let Some(defaults) = checkout {
            let seeded = user.filter(|u| match tandem::registry::seed_user_config(&defaults, u) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("cannot write {} ({e}); using {} as it is", u.display(), defaults.display());
                    false
                }
            });
            return Ok(Locations { models_toml: seeded.unwrap_or(defaults), ui_dir });
        }
        let home = cx.home.as_ref().context("no home folder (HOME) to keep models.toml in; set TANDEM_CONFIG")?;
        let models_toml = home.join(".tandem").join("models.toml");
        if !models_toml.is_file() {
            write_first_registry(&models_toml, cx.resources.as_deref())?;
        }
        Ok(Locations { models_toml, ui_dir })
    }
}

/// `~/.tandem/models.toml` naming the bundled model (when the bundle has one).
fn write_first_registry(path: &Path, resources: Option<&Path>) -> anyhow::Result<()> {
    let bundled = resources.map(|r| r.join("models").join("tandem-tiny")).filter(|p| p.join("config.json").is_file());
    let mut text = String::from(
        "# Tandem's model registry. `tandem models` lists what it finds; settings changed in the app are saved here.\n\
         models_dir = \"~/.tandem/models\"   # scanned for model folders; converted models go here\n",
    );
    if let Some(model) = bundled {
        // A JSON string is a valid TOML basic string (the same escapes).
        let quoted = serde_json::to_string(&model.to_string_lossy())?;
        text.push_str(&format!(
            "default = \"tandem-tiny\"\n\n\
             # The small model bundled with the app.\n\
             [[model]]\n\
             name = \"tandem-tiny\"\n\
             path = {quoted}\n\
             mtp = {{ enabled = true, depth = 3 }}\n\
             sampling = {{ temperature = 0.7, top_p = 0.95, max_tokens = 512 }}\n"
        ));
    }
    let dir = path.parent().context("models.toml has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    tracing::info!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem::registry::Registry;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tandem-locations-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn tandem_config_wins() {
        let cx = Environment {
            config_env: Some("/x/models.toml".into()),
            exe: Some(repo().join("target/debug/tandem-desktop")),
            ..Environment::default()
        };
        assert_eq!(
            Locations::resolve_in(&cx).unwrap(),
            Locations { models_toml: "/x/models.toml".into(), ui_dir: None }
        );
    }

    #[test]
    fn a_development_build_uses_its_checkouts_registry() {
        // A home where nothing can be written (a plain file, so not even root can make a folder in it):
        // the checkout's file itself.
        let root = scratch("no-home");
        std::fs::write(root.join("home"), "not a folder").unwrap();
        let cx = Environment {
            exe: Some(repo().join("target/debug/tandem-desktop")),
            home: Some(root.join("home")),
            ..Environment::default()
        };
        assert_eq!(Locations::resolve_in(&cx).unwrap().models_toml, repo().join("models.toml"));
    }

    #[test]
    fn a_development_build_keeps_the_persons_settings_in_their_home_not_the_checkout() {
        let root = scratch("dev-home");
        let cx = Environment {
            exe: Some(repo().join("target/debug/tandem-desktop")),
            home: Some(root.clone()),
            ..Environment::default()
        };
        let defaults = std::fs::read(repo().join("models.toml")).unwrap();
        let found = Locations::resolve_in(&cx).unwrap().models_toml;
        assert_eq!(found, root.join(".tandem/models.toml"));
        let registry = Registry::load(&found).unwrap();
        let tiny = registry.get("tandem-tiny").expect("the checkout's models, seeded");
        assert_eq!(tiny.path.canonicalize().unwrap(), repo().join("assets/models/tandem-tiny").canonicalize().unwrap());
        assert_eq!(std::fs::read(repo().join("models.toml")).unwrap(), defaults, "the checkout's file is only read");
        // Later starts read the person's file.
        std::fs::write(&found, "models_dir = \"~/elsewhere\"\n").unwrap();
        assert_eq!(Locations::resolve_in(&cx).unwrap().models_toml, found);
        assert_eq!(std::fs::read_to_string(&found).unwrap(), "models_dir = \"~/elsewhere\"\n");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_bundled_app_writes_a_registry_naming_its_model_once_and_serves_its_ui() {
        let root = scratch("bundle");
        let resources = root.join("Tandem.app/Contents/Resources");
        std::fs::create_dir_all(resources.join("models")).unwrap();
        std::fs::create_dir_all(resources.join("ui/dist")).unwrap();
        std::fs::write(resources.join("ui/dist/index.html"), "<!doctype html>").unwrap();
        std::os::unix::fs::symlink(repo().join("assets/models/tandem-tiny"), resources.join("models/tandem-tiny"))
            .unwrap();
        let cx = Environment {
            exe: Some(root.join("Tandem.app/Contents/MacOS/Tandem")),
            home: Some(root.join("home")),
            resources: Some(resources.clone()),
            ..Environment::default()
        };
        let found = Locations::resolve_in(&cx).unwrap();
        assert_eq!(found.models_toml, root.join("home/.tandem/models.toml"));
        assert_eq!(found.ui_dir, Some(resources.join("ui/dist")));
        let registry = Registry::load(&found.models_toml).unwrap();
        let model = registry.get("tandem-tiny").expect("the bundled model is registered");
        assert_eq!(model.path, resources.join("models/tandem-tiny"));
        assert_eq!(registry.default_model().unwrap().name, "tandem-tiny");

        // Later starts keep the person's file as it is.
        std::fs::write(&found.models_toml, "models_dir = \"~/elsewhere\"\n").unwrap();
        Locations::resolve_in(&cx).unwrap();
        assert_eq!(std::fs::read_to_string(&found.models_toml).unwrap(), "models_dir = \"~/elsewhere\"\n");

        // TANDEM_UI_DIR leaves the UI to ServeConfig.
        assert_eq!(Locations::resolve_in(&Environment { ui_env: true, ..cx }).unwrap().ui_dir, None);
        std::fs::remove_dir_all(root).unwrap();
    }
}
