//! Native drag and drop: the operating system tells the shell which paths were dropped on the
//! window (a browser page is never told); the shell hands the folder to the UI, which opens Convert
//! with it (ui/README.md, "The desktop shell's hooks"). Whether the folder holds a model is the
//! server's to say when the conversion starts.

use std::path::{Path, PathBuf};

/// The folder a drop means: the first dropped folder, else the folder of the first dropped file
/// (people drag a model's `config.json` or a `.safetensors` file as often as its folder).
pub fn folder_of(paths: &[PathBuf]) -> Option<PathBuf> {
    if let Some(dir) = paths.iter().find(|p| p.is_dir()) {
        return Some(dir.clone());
    }
    paths.first().and_then(|p| p.parent()).filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf)
}

/// JavaScript that gives the UI the folder: `window.onFolderDropped(path)` when the UI has installed
/// it, else the `tandem://dropped-folder` event (which the UI also listens to).
pub fn script(folder: &Path) -> String {
    let path = serde_json::to_string(&folder.to_string_lossy()).expect("a string serializes");
    format!(
        "(function (p) {{ if (typeof window.onFolderDropped === 'function') {{ window.onFolderDropped(p); }} \
         else {{ window.dispatchEvent(new CustomEvent('tandem://dropped-folder', {{ detail: {{ path: p }} }})); }} }})({path});"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_folder_is_taken_as_it_is_and_a_file_means_its_folder() {
        let dir = tempfile_dir();
        let file = dir.join("config.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(folder_of(std::slice::from_ref(&dir)), Some(dir.clone()));
        assert_eq!(folder_of(std::slice::from_ref(&file)), Some(dir.clone()));
        // A folder anywhere in the drop wins over files.
        assert_eq!(folder_of(&[file, dir.clone()]), Some(dir.clone()));
        assert_eq!(folder_of(&[]), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_script_quotes_the_path_as_a_javascript_string() {
        let s = script(Path::new("/Users/ann/My \"models\"/Qwen3.5 'x'\n\\y"));
        assert!(s.contains(r#"("/Users/ann/My \"models\"/Qwen3.5 'x'\n\\y")"#), "{s}");
        assert!(s.contains("window.onFolderDropped(p)"));
        assert!(s.contains("'tandem://dropped-folder'"));
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tandem-drop-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
