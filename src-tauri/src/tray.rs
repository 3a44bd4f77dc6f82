//! The tray (menu-bar) icon: what the engine is doing (loaded model, live tok/s and acceptance,
//! memory), and a few actions (show the window, load or unload the default model, quit). Everything
//! it shows comes from the engine's statistics snapshots; everything it does is one engine call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem::engine::{Engine, StatsSnapshot};
use tauri::image::Image;
use tauri::menu::{Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::{TrayIcon, TrayIconBuilder};
use tauri::{AppHandle, Wry};
use tokio::sync::broadcast::error::RecvError;

/// Memory is re-read this often when nothing else publishes a snapshot.
const IDLE_REFRESH: Duration = Duration::from_secs(3);

/// The tray menu's lines, computed from one snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct TrayView {
    pub model: String,
    pub speed: String,
    pub memory: String,
    /// Text beside the icon in the macOS menu bar (and the Linux indicator's label) while generating.
    pub title: Option<String>,
    pub load: String,
    pub can_load: bool,
    pub unload: String,
    pub can_unload: bool,
}

impl TrayView {
    /// `default_model`: the registry's default, the one the menu loads and unloads.
    /// `notice`: a load in progress or a failed one, shown instead of the model line.
    pub fn of(snapshot: &StatsSnapshot, default_model: Option<&str>, notice: Option<&str>) -> TrayView {
        let model = match (notice, snapshot.loaded_models.as_slice()) {
            (Some(notice), _) => notice.to_owned(),
            (None, []) => "No model loaded".to_owned(),
            (None, loaded) => format!("Model: {}", loaded.join(", ")),
        };
        // A loaded model whose MTP head does not run says so, and why (the load-time probe's figures).
        let mtp_off: Vec<String> = snapshot
            .models
            .iter()
            .filter(|m| !m.mtp_loaded)
            .map(|m| format!("{}: MTP off ({})", m.id, m.mtp_reason.as_deref().unwrap_or("no MTP head")))
            .collect();
        let model =
            if mtp_off.is_empty() || notice.is_some() { model } else { format!("{model} · {}", mtp_off.join("; ")) };
        let acceptance = |a: Option<f64>| a.map(|a| format!(" · MTP acceptance {:.0}%", a * 100.0)).unwrap_or_default();
        let speed = if snapshot.generating && snapshot.tok_s <= 0.0 {
            // The first token is still coming (prefill).
            "Generating…".to_owned()
        } else if snapshot.generating {
            format!("Generating: {:.1} tok/s{}", snapshot.tok_s, acceptance(snapshot.acceptance))
        } else if let Some(last) = &snapshot.last {
            let accepted = last.stats.spec.as_ref().map(|s| s.acceptance);
            format!("Last answer: {:.1} tok/s{}", last.stats.decode_tok_s, acceptance(accepted))
        } else {
            "Speed: —".to_owned()
        };
        let m = &snapshot.memory;
        let memory = if m.active_bytes > 0 {
            format!("Memory: {} (models {})", bytes(m.rss_bytes), bytes(m.active_bytes))
        } else {
            format!("Memory: {}", bytes(m.rss_bytes))
        };
        let title = (snapshot.generating && snapshot.tok_s > 0.0).then(|| format!("{:.0} tok/s", snapshot.tok_s));
        let (load, unload, can_load, can_unload) = match default_model {
            Some(name) => {
                let loaded = snapshot.loaded_models.iter().any(|m| m == name);
                (
                    format!("Load {name}"),
                    format!("Unload {name}"),
                    !loaded && notice.is_none(),
                    loaded && notice.is_none(),
                )
            }
            None => ("Load the default model".to_owned(), "Unload the default model".to_owned(), false, false),
        };
        TrayView { model, speed, memory, title, load, can_load, unload, can_unload }
    }
}

/// `1.2 GB`, `340 MB`, decimal units as the Finder shows them.
fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0} MB", n / 1e6)
    } else {
        format!("{:.0} kB", n / 1e3)
    }
}

/// The menu's items that change.
struct Items {
    tray: TrayIcon,
    model: MenuItem<Wry>,
    speed: MenuItem<Wry>,
    memory: MenuItem<Wry>,
    load: MenuItem<Wry>,
    unload: MenuItem<Wry>,
    shown: Mutex<Option<TrayView>>,
    /// "Loading tandem-tiny…" or "Could not load …", until the next load or unload.
    notice: Mutex<Option<String>>,
}

impl Items {
    fn show(&self, view: TrayView) {
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        if shown.as_ref() == Some(&view) {
            return;
        }
        let old = shown.take();
        let changed = |f: fn(&TrayView) -> &str| old.as_ref().map(f) != Some(f(&view));
        let results = [
            if changed(|v| &v.model) { self.model.set_text(&view.model) } else { Ok(()) },
            if changed(|v| &v.speed) { self.speed.set_text(&view.speed) } else { Ok(()) },
            if changed(|v| &v.memory) { self.memory.set_text(&view.memory) } else { Ok(()) },
            self.load.set_text(&view.load),
            self.load.set_enabled(view.can_load),
            self.unload.set_text(&view.unload),
            self.unload.set_enabled(view.can_unload),
            self.tray.set_title(view.title.as_deref()),
            self.tray.set_tooltip(Some(format!("Tandem — {} — {}", view.model, view.speed))),
        ];
        for error in results.into_iter().filter_map(Result::err) {
            tracing::debug!("tray update: {error}");
        }
        *shown = Some(view);
    }

    fn notice(&self) -> Option<String> {
        self.notice.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_notice(&self, notice: Option<String>) {
        *self.notice.lock().unwrap_or_else(|p| p.into_inner()) = notice;
    }
}

fn refresh(items: &Items, engine: &Engine, snapshot: &StatsSnapshot) {
    let default = engine.default_model().ok();
    items.show(TrayView::of(snapshot, default.as_deref(), items.notice().as_deref()));
}

/// Creates the tray icon and keeps its menu current from the engine's statistics.
pub fn install(app: &AppHandle, engine: Engine, server_url: String) -> tauri::Result<()> {
    let disabled = |id: &str, text: &str| MenuItem::with_id(app, id, text, false, None::<&str>);
    let model = disabled("model", "No model loaded")?;
    let speed = disabled("speed", "Speed: —")?;
    let memory = disabled("memory", "Memory: —")?;
    let address = disabled("address", &format!("API: {server_url}"))?;
    let show = MenuItem::with_id(app, "show", "Show Tandem", true, None::<&str>)?;
    let load = MenuItem::with_id(app, "load", "Load the default model", false, None::<&str>)?;
    let unload = MenuItem::with_id(app, "unload", "Unload the default model", false, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit Tandem", true, None::<&str>)?;
    let menu = Menu::with_items(
        app,
        &[
            &model,
            &speed,
            &memory,
            &address,
            &PredefinedMenuItem::separator(app)?,
            &show,
            &load,
            &unload,
            &PredefinedMenuItem::separator(app)?,
            &quit,
        ],
    )?;

    // The macOS menu bar tints a black template image to match light or dark menu bars.
    let (icon, template) = if cfg!(target_os = "macos") {
        (&include_bytes!("../../assets/icons/tray-template.png")[..], true)
    } else {
        (&include_bytes!("../../assets/icons/tray.png")[..], false)
    };
    let tray = TrayIconBuilder::with_id("tandem")
        .icon(Image::from_bytes(icon)?)
        .icon_as_template(template)
        .tooltip("Tandem")
        .menu(&menu)
        .show_menu_on_left_click(true)
        .build(app)?;

    let items =
        Arc::new(Items { tray, model, speed, memory, load, unload, shown: Mutex::new(None), notice: Mutex::new(None) });
    refresh(&items, &engine, &engine.stats());

    tray_actions(app, &items, &engine);
    tauri::async_runtime::spawn(follow_stats(items, engine));
    Ok(())
}

fn tray_actions(app: &AppHandle, items: &Arc<Items>, engine: &Engine) {
    let (items, engine) = (items.clone(), engine.clone());
    app.on_menu_event(move |app, event| match event.id().as_ref() {
        "show" => crate::show_main_window(app),
        "quit" => app.exit(0),
        "load" | "unload" => {
            let Ok(name) = engine.default_model() else { return };
            let load = event.id().as_ref() == "load";
            let (items, engine) = (items.clone(), engine.clone());
            if load {
                items.set_notice(Some(format!("Loading {name}…")));
                refresh(&items, &engine, &engine.stats());
            }
            tauri::async_runtime::spawn(async move {
                let outcome =
                    if load { engine.load(&name).await.map(|_| ()) } else { engine.unload(&name).await.map(|_| ()) };
                items.set_notice(match outcome {
                    Ok(()) => None,
                    Err(error) => {
                        let error = error.message();
                        tracing::warn!("tray: {error}");
                        Some(format!("Could not {} {name}: {error}", if load { "load" } else { "unload" }))
                    }
                });
                refresh(&items, &engine, &engine.stats());
            });
        }
        _ => {}
    });
}

/// Follows the engine's snapshots (a few per second while generating), and re-reads memory now and
/// then when idle.
async fn follow_stats(items: Arc<Items>, engine: Engine) {
    let mut snapshots = engine.subscribe_stats();
    let mut idle = tokio::time::interval(IDLE_REFRESH);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let snapshot = tokio::select! {
            received = snapshots.recv() => match received {
                Ok(snapshot) => snapshot,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            },
            _ = idle.tick() => {
                let engine = engine.clone();
                match tokio::task::spawn_blocking(move || engine.stats()).await {
                    Ok(snapshot) => Arc::new(snapshot),
                    Err(_) => continue,
                }
            }
        };
        refresh(&items, &engine, &snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem::engine::{LastGeneration, LoadedModel, Memory, Totals};
    use tandem::generate::{FinishReason, SpecStats, Stats};

    fn idle() -> StatsSnapshot {
        StatsSnapshot {
            time_ms: 0,
            uptime_s: 1.0,
            generating: false,
            model: None,
            tok_s: 0.0,
            streams: 0,
            acceptance: None,
            tok_per_cycle: None,
            stats: None,
            loaded_models: vec![],
            models: vec![],
            running: vec![],
            last: None,
            series: vec![],
            totals: Totals::default(),
            memory: Memory { rss_bytes: 412_000_000, ..Memory::default() },
        }
    }

    fn stats(decode_tok_s: f64, acceptance: Option<f64>) -> Stats {
        Stats {
            decode_tok_s,
            spec: acceptance.map(|acceptance| SpecStats {
                method: "mtp".into(),
                depth: 3,
                acceptance,
                ..SpecStats::default()
            }),
            ..Stats::default()
        }
    }

    #[test]
    fn idle_without_a_model() {
        let view = TrayView::of(&idle(), Some("tandem-tiny"), None);
        assert_eq!(view.model, "No model loaded");
        assert_eq!(view.speed, "Speed: —");
        assert_eq!(view.memory, "Memory: 412 MB");
        assert_eq!(view.title, None);
        assert_eq!((view.load.as_str(), view.can_load, view.can_unload), ("Load tandem-tiny", true, false));
    }

    #[test]
    fn generating_shows_live_speed_acceptance_and_memory() {
        let snapshot = StatsSnapshot {
            generating: true,
            model: Some("tandem-tiny".into()),
            tok_s: 41.26,
            acceptance: Some(0.724),
            loaded_models: vec!["tandem-tiny".into()],
            memory: Memory { rss_bytes: 1_234_000_000, active_bytes: 28_000_000, ..Memory::default() },
            ..idle()
        };
        let view = TrayView::of(&snapshot, Some("tandem-tiny"), None);
        assert_eq!(view.model, "Model: tandem-tiny");
        assert_eq!(view.speed, "Generating: 41.3 tok/s · MTP acceptance 72%");
        assert_eq!(view.memory, "Memory: 1.2 GB (models 28 MB)");
        assert_eq!(view.title.as_deref(), Some("41 tok/s"));
        assert_eq!((view.unload.as_str(), view.can_load, view.can_unload), ("Unload tandem-tiny", false, true));
    }

    #[test]
    fn a_loaded_model_whose_mtp_is_off_says_why() {
        let snapshot = StatsSnapshot {
            loaded_models: vec!["grafted".into()],
            models: vec![LoadedModel {
                id: "grafted".into(),
                busy: false,
                running: 0,
                queued: 0,
                mtp_loaded: false,
                mtp_reason: Some("the MTP head probes at best 0.012".into()),
                prefix_cache: Default::default(),
            }],
            ..idle()
        };
        let view = TrayView::of(&snapshot, Some("grafted"), None);
        assert_eq!(view.model, "Model: grafted · grafted: MTP off (the MTP head probes at best 0.012)");
    }

    #[test]
    fn before_the_first_token_it_says_generating_without_a_speed() {
        let snapshot = StatsSnapshot { generating: true, loaded_models: vec!["tandem-tiny".into()], ..idle() };
        let view = TrayView::of(&snapshot, Some("tandem-tiny"), None);
        assert_eq!(view.speed, "Generating…");
        assert_eq!(view.title, None);
    }

    #[test]
    fn idle_after_an_answer_shows_the_last_one() {
        let snapshot = StatsSnapshot {
            loaded_models: vec!["tandem-tiny".into()],
            last: Some(LastGeneration {
                model: "tandem-tiny".into(),
                request: 1,
                finish: FinishReason::Stop,
                ended_ms: 0,
                stats: stats(55.0, Some(0.5)),
            }),
            ..idle()
        };
        let view = TrayView::of(&snapshot, Some("tandem-tiny"), None);
        assert_eq!(view.speed, "Last answer: 55.0 tok/s · MTP acceptance 50%");
        let without_mtp = StatsSnapshot {
            last: snapshot.last.clone().map(|l| LastGeneration { stats: stats(9.0, None), ..l }),
            ..snapshot
        };
        assert_eq!(TrayView::of(&without_mtp, Some("tandem-tiny"), None).speed, "Last answer: 9.0 tok/s");
    }

    #[test]
    fn a_load_in_progress_disables_both_actions() {
        let view = TrayView::of(&idle(), Some("tandem-tiny"), Some("Loading tandem-tiny…"));
        assert_eq!(view.model, "Loading tandem-tiny…");
        assert!(!view.can_load && !view.can_unload);
        let none = TrayView::of(&idle(), None, None);
        assert!(!none.can_load && !none.can_unload);
    }
}
