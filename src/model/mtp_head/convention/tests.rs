use super::*;

fn stats(prov: Provenance, means: &[f32]) -> Vec<NormStat> {
    means
        .iter()
        .enumerate()
        .map(|(i, &mean)| NormStat {
            name: format!("mtp.n{i}.weight"),
            key: format!("k{i}"),
            file: "m.safetensors".into(),
            provenance: prov,
            mean,
        })
        .collect()
}

fn reference(scale: f32) -> Reference {
    Reference { key: "language_model.model.norm.weight".into(), file: "model.safetensors".into(), scale }
}

#[test]
fn a_head_written_with_its_body_keeps_its_names_whatever_its_means() {
    // A converted head whose raw means are about -0.4 (stored 0.6) next to a body final norm of
    // scale 1.54: each norm's mean sits nearer the body as if zero-centred. Names decide.
    let d = decide(HeadOrigin::WithBody, stats(Provenance::Mlx, &[0.6; 7]), &reference(1.54));
    assert!(d.norms.iter().all(|n| n.stored == Stored::Shifted), "{d:?}");
    assert!(d.repaired.is_none() && d.refused.is_none() && d.doubt.is_none(), "{d:?}");
    // The same values, re-attached, are repaired (the old, per-norm behaviour for every head).
    let d = decide(HeadOrigin::Grafted("test".into()), stats(Provenance::Mlx, &[0.6; 7]), &reference(1.54));
    assert!(d.norms.iter().all(|n| n.stored == Stored::ZeroCentred), "{d:?}");
    assert!(d.repaired.as_deref().is_some_and(|m| m.contains("7 tensor") && m.contains("`k0` mean 0.600")), "{d:?}");
}

#[test]
fn shifted_twice_is_refused_only_by_a_majority() {
    let d = decide(HeadOrigin::WithBody, stats(Provenance::Mlx, &[2.0; 7]), &reference(1.0));
    let r = d.refused.as_deref().unwrap_or_default();
    assert!(r.contains("7 of 7") && r.contains("shifted twice") && r.contains("m.safetensors: `k3` mean 2.000"), "{r}");
    assert!(r.contains("model.safetensors: `language_model.model.norm.weight` has mean scale 1.000"), "{r}");
    // Four high norms are not enough: the names stand, with a doubt that names them.
    let d = decide(HeadOrigin::WithBody, stats(Provenance::Mlx, &[2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0]), &reference(1.0));
    assert!(d.refused.is_none() && d.norms.iter().all(|n| n.stored == Stored::Shifted), "{d:?}");
    assert!(d.doubt.as_deref().is_some_and(|m| m.contains("4 of 7") && m.contains("`k0`")), "{d:?}");
}

#[test]
fn a_raw_head_on_a_raw_body_is_never_second_guessed() {
    let d = decide(HeadOrigin::WithBody, stats(Provenance::Hf, &[1.2; 7]), &reference(1.0));
    assert!(
        d.norms.iter().all(|n| n.stored == Stored::ZeroCentred) && d.repaired.is_none() && d.refused.is_none(),
        "{d:?}"
    );
}

#[test]
fn one_outlier_does_not_split_a_grafted_head() {
    // Raw names, raw values, one norm far off: the head stays zero-centred as a whole.
    let d = decide(
        HeadOrigin::Grafted("test".into()),
        stats(Provenance::Hf, &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.3]),
        &reference(1.0),
    );
    assert!(d.norms.iter().all(|n| n.stored == Stored::ZeroCentred) && d.repaired.is_none(), "{d:?}");
    assert!(d.doubt.is_some());
}
