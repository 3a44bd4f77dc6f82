//! Writing to stdout when the reader may go away (`tandem ... | head`): a closed pipe ends the
//! program quietly instead of panicking inside `println!`.

use std::io::Write;

pub fn text(s: &str) {
    let mut o = std::io::stdout().lock();
    if o.write_all(s.as_bytes()).and_then(|_| o.flush()).is_err() {
        std::process::exit(0);
    }
}

pub fn line(s: impl std::fmt::Display) {
    text(&format!("{s}\n"));
}
