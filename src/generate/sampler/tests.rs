use super::*;

/// OpenAI's definition: logit[j] - count[j] * frequency - (count[j] > 0) * presence, where count
/// is over the generated tokens; the prompt's tokens are not counted.
#[test]
fn presence_and_frequency_penalties_count_generated_tokens_only() {
    let logits: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 1.0).collect();
    let params = SamplingParams { presence_penalty: 0.4, frequency_penalty: 0.25, ..Default::default() };
    let sampler = Sampler::new(params).unwrap().with_prompt_len(3);
    // Prompt 5, 5, 6; generated 1, 2, 2, 2, 5.
    let history = [5u32, 5, 6, 1, 2, 2, 2, 5];
    let got = sampler.penalize(&Array::from_slice(&logits, &[8]).unwrap(), &history).unwrap().to_vec::<f32>().unwrap();
    let mut counts = [0u32; 8];
    for &t in &history[3..] {
        counts[t as usize] += 1;
    }
    for j in 0..8 {
        let c = counts[j] as f32;
        let want = logits[j] - c * 0.25 - if c > 0.0 { 0.4 } else { 0.0 };
        assert!((got[j] - want).abs() < 1e-6, "token {j}: {} vs {want}", got[j]);
    }
    // Token 6 appears only in the prompt: untouched.
    assert_eq!(got[6], logits[6]);
    assert!(sampler.params.uses_history());
}

#[test]
fn penalties_outside_openais_range_are_refused_by_name() {
    let e = SamplingParams { presence_penalty: 2.5, ..Default::default() }.validate().unwrap_err();
    assert!(e.contains("presence_penalty"), "{e}");
    let e = SamplingParams { frequency_penalty: -3.0, ..Default::default() }.validate().unwrap_err();
    assert!(e.contains("frequency_penalty"), "{e}");
}
