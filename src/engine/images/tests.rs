use super::*;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn image(name: &str) -> Image {
    Image { bytes: std::fs::read(fixture(name)).unwrap(), media_type: None }
}

#[test]
fn pixel_limits_and_the_queue_budget() {
    let vlm = fixture("tiny-vlm");
    // tiny-vlm asks for at most 1,048,576 pixels: the CPU default keeps it, a lower cap wins.
    let cpu = ImageReader::new("vlm", &vlm, &ImageLimits::default(), false);
    assert_eq!(cpu.processor().unwrap().max_pixels, CPU_MAX_PIXELS);
    let small = ImageLimits { max_pixels: Some(100), ..ImageLimits::default() };
    let p = ImageReader::new("vlm", &vlm, &small, true);
    assert_eq!(p.processor().unwrap().max_pixels, 4096, "never below min_pixels");
    // Qwen3.5's defaults (16.7 MP) are capped per device.
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/models/tandem-tiny");
    assert_eq!(
        ImageReader::new("t", &text, &ImageLimits::default(), true).processor().unwrap().max_pixels,
        GPU_MAX_PIXELS
    );

    let canyon = image("images/black-canyon-96x64.png");
    let (decoded, held) = cpu.read("vlm", &[&canyon, &canyon]).unwrap();
    assert_eq!(decoded.iter().map(ImageInput::tokens).collect::<Vec<_>>(), [6, 6]);
    let bytes = 2 * 24 * 1536 * 4;
    assert_eq!(cpu.held(), bytes);
    drop(held);
    assert_eq!(cpu.held(), 0);

    let tight = ImageReader::new(
        "vlm",
        &vlm,
        &ImageLimits { max_queued_bytes: 24 * 1536 * 4, max_per_request: 2, ..ImageLimits::default() },
        false,
    );
    let (_first, _held) = tight.read("vlm", &[&canyon]).unwrap();
    let e = tight.read("vlm", &[&canyon]).err().unwrap();
    assert!(matches!(e, EngineError::ImagesBusy { .. }), "{e}");
    assert_eq!(tight.held(), 24 * 1536 * 4, "a refused request holds nothing");
    let e = tight.read("vlm", &[&canyon, &canyon]).err().unwrap();
    assert!(matches!(&e, EngineError::InvalidImage(m) if m.contains("over the 0.1 MiB")), "never fits: {e}");
    let e = tight.read("vlm", &[&canyon, &canyon, &canyon]).err().unwrap();
    assert!(matches!(&e, EngineError::InvalidImage(m) if m.contains("3 images") && m.contains("at most 2")), "{e}");

    let mut broken = canyon.clone();
    broken.bytes.truncate(broken.bytes.len() / 2);
    let e = cpu.read("vlm", &[&canyon, &broken]).err().unwrap();
    assert!(matches!(&e, EngineError::InvalidImage(m) if m.starts_with("image #2: cannot decode")), "{e}");
    assert_eq!(cpu.held(), 0);
}
