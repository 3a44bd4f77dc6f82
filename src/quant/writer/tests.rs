//! The temporary folders of conversions: replacing a destination, and sweeping what killed runs left.

use super::*;

fn folder(path: &Path, content: &str) {
    std::fs::create_dir_all(path).unwrap();
    std::fs::write(path.join("config.json"), content).unwrap();
}

fn content(path: &Path) -> String {
    std::fs::read_to_string(path.join("config.json")).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn leftover_names_are_recognised_exactly() {
    assert_eq!(parse_leftover(".m.partial-12-0"), Some(("m", false, "12-0")));
    assert_eq!(parse_leftover(".my.model.old-7-3"), Some(("my.model", true, "7-3")));
    assert_eq!(parse_leftover(".m.partial-x-0"), None);
    assert_eq!(parse_leftover(".m.partial-12"), None);
    assert_eq!(parse_leftover("m.partial-12-0"), None);
    assert_eq!(parse_leftover(".partial-12-0"), None);
    assert_eq!(parse_leftover(".git"), None);
}

#[test]
fn sweep_removes_dead_partials_restores_moved_destinations_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    folder(&d.join(".a.partial-100-0"), "dead partial");
    folder(&d.join(".b.partial-200-0"), "live partial");
    folder(&d.join(".c.old-100-1"), "old c");
    folder(&d.join(".c.partial-100-2"), "new c");
    folder(&d.join(".e.old-100-3"), "old e");
    folder(&d.join("e"), "new e");
    folder(&d.join(".hidden"), "not ours");
    let done = sweep_matching(d, None, &|pid| pid == 200);
    assert_eq!(done.len(), 4, "{done:?}");
    assert_eq!(names(d), [".b.partial-200-0", ".hidden", "c", "e"]);
    assert_eq!(content(&d.join("c")), "old c", "the destination a kill left missing is put back");
    assert_eq!(content(&d.join("e")), "new e", "a destination in place is kept");
    // Only one destination's leftovers.
    folder(&d.join(".f.partial-100-0"), "f");
    folder(&d.join(".g.partial-100-0"), "g");
    sweep_matching(d, Some("f"), &|_| false);
    assert!(!d.join(".f.partial-100-0").exists() && d.join(".g.partial-100-0").exists());
    // A real sweep keeps this process's own folders.
    let mine = d.join(format!(".h.partial-{}-0", std::process::id()));
    folder(&mine, "h");
    sweep(d);
    assert!(mine.exists());
}

#[test]
fn a_failure_between_the_renames_keeps_or_restores_the_old_destination() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (new, dst, old) = (d.join(".m.partial-100-0"), d.join("m"), d.join(".m.old-100-1"));
    folder(&new, "new");
    folder(&dst, "old");
    // An error between the two renames: the old destination is put back at once.
    let e = replace_in_two_steps(&new, &dst, &old, || Err(std::io::Error::other("simulated"))).unwrap_err();
    assert!(e.to_string().contains("simulated"), "{e}");
    assert_eq!(content(&dst), "old");
    assert!(!old.exists() && new.exists());
    // A kill between them (nothing runs after the first rename): the next start's sweep restores it.
    std::fs::rename(&dst, &old).unwrap();
    sweep_matching(d, None, &|_| false);
    assert_eq!(names(d), ["m"]);
    assert_eq!(content(&dst), "old");
}

#[test]
fn force_commit_replaces_the_destination_and_leaves_nothing_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("m");
    folder(&dst, "old");
    let partial = PartialDir::create(&dst).unwrap();
    folder(&partial.path, "new");
    assert!(matches!(PartialDir::create(&dst).unwrap().commit(false), Err(ConvertError::DestinationExists(_))));
    partial.commit(true).unwrap();
    assert_eq!(content(&dst), "new");
    assert_eq!(names(dir.path()), ["m"]);
    // Without exchange support the two-step path gives the same result.
    let (new, old) = (dir.path().join(".m.partial-1-9"), dir.path().join(".m.old-1-9"));
    folder(&new, "newer");
    replace_in_two_steps(&new, &dst, &old, || Ok(())).unwrap();
    assert_eq!(content(&dst), "newer");
    assert_eq!(names(dir.path()), ["m"]);
}
