//! Opening the files a model folder names, as policy in one place: only regular files (a FIFO
//! blocks its reader forever, a device such as `/dev/zero` never ends), and the small ones
//! (configs, tokenizer, chat template, index) read within a size cap per kind, so a hostile or
//! broken download can neither hang nor exhaust the process. Errors are `io::Error`s whose message
//! says what the file is or how big, so callers keep naming the path as they do for any I/O error.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The most bytes a small file of a model folder may have, by file name. Each cap is far above
/// what real checkpoints ship (Qwen3.5's tokenizer.json is 13 MB, its config.json 5 KB).
pub fn size_cap(path: &Path) -> u64 {
    const MIB: u64 = 1 << 20;
    match path.file_name().and_then(|n| n.to_str()).unwrap_or("") {
        "tokenizer.json" => 128 * MIB,
        "model.safetensors.index.json" => 64 * MIB,
        // mlx-lm writes per-module quantization entries into config.json; added-token tables of
        // tokenizer_config.json can be long.
        "config.json" | "tokenizer_config.json" => 16 * MIB,
        // chat_template.jinja, chat_template.json, generation_config.json, preprocessor configs.
        _ => 4 * MIB,
    }
}

/// Opens `path` for reading only if it is a regular file (after following symlinks, since the
/// Hugging Face cache links every file into its blobs). Opened non-blocking so that a FIFO swapped
/// in after any earlier check cannot block the open; the kind is then checked on the open file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let link = std::fs::read_link(path).map(|t| format!(" (a link to {})", t.display())).unwrap_or_default();
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}{link}, not a regular file", kind_of(&meta)),
        ));
    }
    Ok(file)
}

/// Reads a small file of a model folder whole, refusing anything but a regular file and anything
/// over [`size_cap`] (checked on the size before reading, and again while reading, for a file that
/// grows).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let cap = size_cap(path);
    let file = open_regular(path)?;
    let too_large = |size: u64| {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{size} bytes, more than the {} MiB allowed for this file", cap >> 20),
        )
    };
    let size = file.metadata()?.len();
    if size > cap {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`read_to_string`], or None when the file does not exist.
pub fn read_if_present(path: &Path) -> io::Result<Option<String>> {
    match read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a named pipe (FIFO)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_and_oversized_files_and_reads_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("config.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read(&link).unwrap_err();
        assert!(e.to_string().contains("character device") && e.to_string().contains("/dev/zero"), "{e}");

        let big = dir.path().join("generation_config.json");
        std::fs::write(&big, vec![b' '; (size_cap(&big) + 1) as usize]).unwrap();
        let e = read(&big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains(&format!("{} bytes", size_cap(&big) + 1)), "{e}");

        let ok = dir.path().join("chat_template.jinja");
        std::fs::write(&ok, "hi").unwrap();
        assert_eq!(read_to_string(&ok).unwrap(), "hi");
        assert!(read_if_present(&dir.path().join("absent.json")).unwrap().is_none());
        assert!(read(dir.path()).unwrap_err().to_string().contains("a folder"));
    }
}
