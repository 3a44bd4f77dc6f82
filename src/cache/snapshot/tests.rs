use super::*;

/// `[1, 2, t, 4]` rows numbered from `first`, so every position is told apart.
fn rows(first: i32, t: i32) -> Array {
    let data: Vec<f32> = (0..2 * t * 4).map(|i| (first * 10_000 + i) as f32).collect();
    Array::from_slice(&data, &[1, 2, t, 4]).unwrap()
}

fn values(a: &Array) -> Vec<f32> {
    a.to_f32_vec().unwrap()
}

#[test]
fn segments_are_whole_blocks_then_the_rest() {
    assert_eq!(bounds(0, 4, 0), vec![0]);
    assert_eq!(bounds(3, 4, 0), vec![0, 3]);
    assert_eq!(bounds(8, 4, 0), vec![0, 4, 8]);
    assert_eq!(bounds(9, 4, 0), vec![0, 4, 8, 9]);
    // The head's entry i goes with token i + 1: block b holds entries [4b - 1, 4b + 3).
    assert_eq!(bounds(8, 4, 1), vec![0, 3, 7, 8]);
    assert_eq!(bounds(7, 4, 1), vec![0, 3, 7]);
    assert_eq!(bounds(2, 4, 1), vec![0, 2]);
}

/// A snapshot keeps the rows it saw while the live cache goes on writing into its buffer in place,
/// and a restored cache writes into its own buffer, never into the snapshot's.
#[test]
fn snapshots_share_nothing_with_live_or_restored_caches() {
    let mut kv = KvCache::default();
    let first = rows(1, 11);
    kv.update(&first, &first).unwrap();
    let linear = LinearState::with_state(rows(2, 3), rows(3, 1));
    let cache = vec![LayerCache::Kv(kv), LayerCache::Linear(linear)];
    let mut head = KvCache::default();
    head.update(&rows(4, 10), &rows(5, 10)).unwrap();
    let hidden = rows(6, 1);
    let snap = Snapshot::take(&cache, Some(&head), &hidden, 11, 4).unwrap();
    let LayerSnapshot::Kv(body) = &snap.layers[0] else { panic!("layer 0 is attention") };
    assert_eq!(body.keys.iter().map(|k| k.dim(2)).collect::<Vec<_>>(), vec![4, 4, 3]);
    assert_eq!(snap.mtp.as_ref().unwrap().keys.iter().map(|k| k.dim(2)).collect::<Vec<_>>(), vec![3, 4, 3]);
    assert_eq!(snap.own_bytes(), snap.bytes() - (4 + 4) * 2 * 4 * 4 * 2 - (3 + 4) * 2 * 4 * 4 * 2);

    // The live cache writes the next rows into its spare room.
    let mut live = cache;
    let next = rows(7, 5);
    live[0].as_kv().unwrap().update(&next, &next).unwrap();
    let joined = |rows: &Rows| concatenate(&rows.keys.iter().collect::<Vec<_>>(), 2).unwrap();
    assert_eq!(values(&joined(body)), values(&first));

    let (mut restored, restored_head) = snap.restore().unwrap();
    assert_eq!(restored_head.unwrap().offset, 10);
    let kv = restored[0].as_kv().unwrap();
    assert_eq!(kv.offset, 11);
    assert_eq!(values(&kv.contents().unwrap().unwrap().0), values(&first));
    kv.update(&next, &next).unwrap();
    kv.trim(16).unwrap();
    kv.update(&rows(8, 11), &rows(8, 11)).unwrap();
    assert_eq!(values(&joined(body)), values(&first), "the restored cache wrote into the snapshot");
    let LayerCache::Linear(s) = &restored[1] else { panic!("layer 1 is linear") };
    assert_eq!(values(s.ssm.as_ref().unwrap()), values(&rows(3, 1)));
}

#[test]
fn a_snapshot_at_the_wrong_length_is_refused() {
    let mut kv = KvCache::default();
    kv.update(&rows(1, 5), &rows(1, 5)).unwrap();
    let err = Snapshot::take(&[LayerCache::Kv(kv)], None, &rows(2, 1), 6, 4).unwrap_err();
    assert!(err.to_string().contains("holds 5 positions"), "{err}");
}

/// A snapshot taken after another along the same sequence (sharing its whole segments, copying only
/// the rows after them) holds the same rows, cut the same way, as one taken alone.
#[test]
fn a_later_snapshot_shares_the_earlier_ones_segments() {
    let mut kv = KvCache::default();
    let first = rows(1, 8);
    kv.update(&first, &first).unwrap();
    let mut head = KvCache::default();
    head.update(&rows(4, 7), &rows(5, 7)).unwrap();
    let hidden = rows(6, 1);
    let cache = vec![LayerCache::Kv(kv.clone())];
    let at8 = Snapshot::take(&cache, Some(&head), &hidden, 8, 4).unwrap();
    let more = rows(2, 5);
    kv.update(&more, &more).unwrap();
    head.update(&rows(7, 5), &rows(8, 5)).unwrap();
    let cache = vec![LayerCache::Kv(kv)];
    let alone = Snapshot::take(&cache, Some(&head), &hidden, 13, 4).unwrap();
    let after = Snapshot::take_after(Some(&at8), &cache, Some(&head), &hidden, 13, 4).unwrap();
    let segments = |s: &Snapshot| -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let LayerSnapshot::Kv(body) = &s.layers[0] else { panic!("layer 0 is attention") };
        (body.keys.iter().map(values).collect(), s.mtp.as_ref().unwrap().keys.iter().map(values).collect())
    };
    assert_eq!(segments(&after), segments(&alone), "the same rows, cut the same way");
    // The earlier snapshot is unchanged by the later one.
    let (LayerSnapshot::Kv(a), LayerSnapshot::Kv(b)) = (&after.layers[0], &at8.layers[0]) else { panic!() };
    assert_eq!((a.keys.len(), b.keys.len()), (4, 2));
    assert_eq!(values(&b.keys[1]), values(&a.keys[1]));
}
