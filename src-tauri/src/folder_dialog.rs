//! The native folder dialog behind the UI's Browse… (`POST /api/folders/pick`). A web page could ask
//! the server to open it, so the server opens it only for a request carrying a token that the shell
//! generates at start and hands to its own window alone (an initialization script): no other page,
//! tab or program on this machine learns it. The folder the person picks is chosen in the engine, so
//! a conversion may read it where it lies.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tandem::server::FolderPicker;

/// The token (128 random bits, hex) and the dialog.
pub fn picker(app: tauri::AppHandle) -> anyhow::Result<FolderPicker> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).context("no random bytes for the window's token")?;
    let token = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(FolderPicker { token, pick: Arc::new(move |title| pick(&app, title)) })
}

/// What the window learns: `window.__TANDEM_SHELL__ = {folderDialog: {header, token}}` (ui/src/shell.ts).
pub fn window_script(picker: &FolderPicker) -> String {
    let shell = serde_json::json!({
        "folderDialog": { "header": tandem::server::SHELL_TOKEN_HEADER, "token": picker.token }
    });
    format!("window.__TANDEM_SHELL__ = {shell};")
}

/// Opens the dialog on the main thread (where the windowing toolkit runs) and waits for the person.
fn pick(app: &tauri::AppHandle, title: &str) -> Option<PathBuf> {
    let (tx, rx) = std::sync::mpsc::channel();
    let title = title.to_owned();
    let shown = app.run_on_main_thread(move || {
        let _ = tx.send(rfd::FileDialog::new().set_title(&title).pick_folder());
    });
    if let Err(error) = shown {
        tracing::warn!("cannot open the folder dialog: {error}");
        return None;
    }
    rx.recv().ok().flatten()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_window_script_carries_the_header_and_a_json_quoted_token() {
        let picker = tandem::server::FolderPicker { token: "ab\"cd".into(), pick: std::sync::Arc::new(|_| None) };
        let s = super::window_script(&picker);
        assert!(s.starts_with("window.__TANDEM_SHELL__ = {"), "{s}");
        let json: serde_json::Value =
            serde_json::from_str(s.trim_start_matches("window.__TANDEM_SHELL__ = ").trim_end_matches(';')).unwrap();
        assert_eq!(json["folderDialog"]["token"], "ab\"cd");
        assert_eq!(json["folderDialog"]["header"], tandem::server::SHELL_TOKEN_HEADER);
    }
}
