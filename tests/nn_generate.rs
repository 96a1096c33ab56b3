//! Generation: the logits processors on hand-made and random logits against transformers' definitions, seeded
//! sampling, stop strings, and whole generations on the reference fixtures (greedy ids of transformers, EOS and
//! stop-string stops, streaming callbacks).

mod common;
use std::path::{Path, PathBuf};

use common::*;
use hierarchos::core::{DType, Tensor};
use hierarchos::nn::sampling::{
    apply_min_p, apply_repetition_penalty, apply_temperature, apply_top_k, apply_top_p, argmax, softmax,
};
use hierarchos::nn::{
    Model, Sampler, SamplingConfig, StopConditions, StopReason, generate, generate::find_stop_string,
};
use serde_json::Value;

const NEG: f32 = f32::NEG_INFINITY;

fn ln(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn kept(logits: &[f32]) -> Vec<bool> {
    logits.iter().map(|x| x.is_finite()).collect()
}

// ----- transformers' warpers, written as its Python does them (sort, cumulative sum, mask) -----

fn ref_top_k(x: &[f32], k: usize) -> Vec<bool> {
    let mut sorted = x.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[k.clamp(1, x.len()) - 1];
    x.iter().map(|&v| v >= kth).collect()
}

fn ref_top_p(x: &[f32], top_p: f32) -> Vec<bool> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let probs = softmax(x);
    let cumsum: Vec<f64> = order
        .iter()
        .scan(0.0, |acc, &i| {
            *acc += probs[i];
            Some(*acc)
        })
        .collect();
    let mut keep = vec![true; x.len()];
    for (j, &i) in order.iter().enumerate() {
        let last = j == order.len() - 1;
        keep[i] = last || cumsum[j] > 1.0 - top_p as f64;
    }
    keep
}

fn ref_min_p(x: &[f32], min_p: f32) -> Vec<bool> {
    let probs = softmax(x);
    let top = probs.iter().copied().fold(0.0, f64::max);
    probs.iter().map(|&p| p >= min_p as f64 * top).collect()
}

#[test]
fn top_k_keeps_the_k_largest_and_their_ties() {
    let x = [1.0, 5.0, 3.0, 5.0, 2.0];
    for (k, want) in [
        (1, [false, true, false, true, false]),
        (2, [false, true, false, true, false]),
        (3, [false, true, true, true, false]),
        (5, [true; 5]),
        (9, [true; 5]),
    ] {
        let mut y = x.to_vec();
        apply_top_k(&mut y, k);
        assert_eq!(kept(&y), want, "k = {k}");
        assert!(
            y.iter().zip(&x).all(|(a, b)| !a.is_finite() || a == b),
            "kept logits unchanged"
        );
    }
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let x = ln(&[0.5, 0.3, 0.12, 0.08]);
    for (p, want) in [
        (0.75, [true, true, false, false]),
        (0.85, [true, true, true, false]),
        (0.95, [true, true, true, true]),
        (0.0, [true, false, false, false]),
    ] {
        let mut y = x.clone();
        apply_top_p(&mut y, p);
        assert_eq!(kept(&y), want, "top_p = {p}");
    }
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_top_one() {
    let x = ln(&[0.5, 0.3, 0.12, 0.08]);
    for (p, want) in [
        (0.2, [true, true, true, false]),
        (0.5, [true, true, false, false]),
        (1.0, [true, false, false, false]),
        (0.0, [true, true, true, true]),
    ] {
        let mut y = x.clone();
        apply_min_p(&mut y, p);
        assert_eq!(kept(&y), want, "min_p = {p}");
    }
}

#[test]
fn warpers_match_transformers_definitions_on_random_logits() {
    let mut rng = Rng::new("warpers_match_transformers_definitions_on_random_logits");
    for n in [1, 3, 17, 257] {
        let x = rng.vec(n, -6.0, 6.0);
        for k in [1, 2, 5, 300] {
            let mut y = x.clone();
            apply_top_k(&mut y, k);
            assert_eq!(kept(&y), ref_top_k(&x, k), "top_k {k} n {n}");
        }
        for p in [0.1, 0.5, 0.9, 0.99] {
            let mut y = x.clone();
            apply_top_p(&mut y, p);
            assert_eq!(kept(&y), ref_top_p(&x, p), "top_p {p} n {n}");
            let mut y = x.clone();
            apply_min_p(&mut y, p);
            assert_eq!(kept(&y), ref_min_p(&x, p), "min_p {p} n {n}");
        }
    }
}

#[test]
fn repetition_penalty_always_makes_seen_tokens_less_likely() {
    let mut x = vec![2.0, -2.0, 1.0, 0.5, 0.0];
    // Id 1 twice is penalized once; an id past the vocabulary is ignored.
    apply_repetition_penalty(&mut x, &[0, 1, 1, 4, 7], 2.0);
    assert_eq!(x, [1.0, -4.0, 1.0, 0.5, 0.0]);
    // A penalty below 1 rewards instead, with the same sign rule.
    let mut x = vec![2.0, -2.0];
    apply_repetition_penalty(&mut x, &[0, 1], 0.5);
    assert_eq!(x, [4.0, -1.0]);
}

#[test]
fn processors_run_in_transformers_order() {
    let mut rng = Rng::new("processors_run_in_transformers_order");
    let x = rng.vec(64, -4.0, 4.0);
    let history = [3, 5, 5, 60];
    let config = SamplingConfig {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        min_p: 0.05,
        repetition_penalty: 1.3,
        seed: 1,
    };
    let mut want = x.clone();
    apply_repetition_penalty(&mut want, &history, 1.3);
    apply_temperature(&mut want, 0.7);
    apply_top_k(&mut want, 20);
    apply_top_p(&mut want, 0.8);
    apply_min_p(&mut want, 0.05);
    let mut got = x.clone();
    Sampler::new(config.clone()).unwrap().process(&mut got, &history);
    assert_eq!(got, want);

    // Greedy decoding applies only the repetition penalty (transformers without do_sample).
    let greedy = SamplingConfig {
        temperature: 0.0,
        ..config
    };
    let mut got = x.clone();
    Sampler::new(greedy).unwrap().process(&mut got, &history);
    let mut want = x.clone();
    apply_repetition_penalty(&mut want, &history, 1.3);
    assert_eq!(got, want);
}

#[test]
fn greedy_takes_the_first_argmax_after_the_penalty() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    // A NaN wins, as in torch and in Tensor::argmax (the GPU's greedy path).
    assert_eq!(argmax(&[1.0, f32::NAN, 3.0, f32::NAN]), 1);
    let mut greedy = Sampler::new(SamplingConfig::default()).unwrap();
    assert_eq!(greedy.sample(&[1.0, 3.0, 3.0, 2.0], &[]).unwrap(), 1);
    let mut penalized = Sampler::new(SamplingConfig {
        repetition_penalty: 2.0,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(penalized.sample(&[3.0, 2.0], &[0]).unwrap(), 1);
}

#[test]
fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
    let x = ln(&[0.5, 0.3, 0.15, 0.05]);
    let config = |seed| SamplingConfig {
        temperature: 1.0,
        seed,
        ..Default::default()
    };
    let draws = |seed| {
        let mut s = Sampler::new(config(seed)).unwrap();
        (0..20_000).map(|_| s.sample(&x, &[]).unwrap()).collect::<Vec<u32>>()
    };
    let a = draws(7);
    assert_eq!(a, draws(7));
    assert_ne!(a, draws(8));
    for (id, p) in [0.5, 0.3, 0.15, 0.05].iter().enumerate() {
        let freq = a.iter().filter(|&&t| t == id as u32).count() as f64 / a.len() as f64;
        // 20000 draws: the standard error is at most 0.0036.
        assert!(
            (freq - p).abs() < 0.02,
            "token {id}: frequency {freq} for probability {p}"
        );
    }
    // Masked tokens are never drawn.
    let mut s = Sampler::new(SamplingConfig { top_k: 2, ..config(3) }).unwrap();
    assert!((0..2000).all(|_| s.sample(&x, &[]).unwrap() < 2));
    let mut s = Sampler::new(SamplingConfig {
        temperature: 1.0,
        seed: 1,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(s.sample(&[NEG, 0.0, NEG], &[]).unwrap(), 1);
}

#[test]
fn bad_settings_and_logits_are_errors() {
    for bad in [
        SamplingConfig {
            temperature: -1.0,
            ..Default::default()
        },
        SamplingConfig {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplingConfig {
            top_p: 1.5,
            ..Default::default()
        },
        SamplingConfig {
            min_p: -0.1,
            ..Default::default()
        },
        SamplingConfig {
            repetition_penalty: 0.0,
            ..Default::default()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
        assert!(Sampler::new(bad).is_err());
    }
    let mut s = Sampler::new(SamplingConfig::default()).unwrap();
    assert!(s.sample(&[], &[]).is_err());
    assert!(s.sample(&[0.0, f32::NAN], &[]).is_err());
    // A temperature so small that the logits overflow has no distribution to draw from (it picked token 0).
    let mut s = Sampler::new(SamplingConfig {
        temperature: 1e-40,
        ..Default::default()
    })
    .unwrap();
    let err = s.sample(&[1.0, 3.0, 2.0, -1.0], &[]).unwrap_err().to_string();
    assert!(err.contains("temperature"), "{err}");
}

#[test]
fn stop_strings_are_found_where_new_text_reaches() {
    let stops = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // "world" was just added: a stop string across the boundary is found, one wholly in older text is not.
    assert_eq!(find_stop_string("hello world", 6, &stops(&["lo w"])), Some(7));
    assert_eq!(find_stop_string("hello world", 6, &stops(&["hell"])), None);
    assert_eq!(
        find_stop_string("hello world", 6, &stops(&["xyz", "rl", "o w"])),
        Some(7)
    );
    assert_eq!(find_stop_string("hello", 5, &stops(&["lo"])), None);
    assert_eq!(find_stop_string("hello", 4, &stops(&["", "lo"])), Some(5));
    // Windows that start inside a multi-byte character are widened, not sliced through.
    assert_eq!(find_stop_string("ééx", 4, &stops(&["ax"])), None);
    assert_eq!(find_stop_string("ééx", 4, &stops(&["éx"])), Some(5));
    assert_eq!(find_stop_string("a😀", 1, &stops(&["😀"])), Some(5));
}

// ----- whole generations on the reference fixtures -----

const FAMILIES: [&str; 5] = ["llama", "llama3_tied", "mistral", "qwen2", "qwen3"];

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
}

fn reference(family: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(family).join("reference.json")).unwrap()).unwrap()
}

fn rows(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

#[test]
fn greedy_generation_matches_transformers_on_every_family() {
    let dev = dev();
    for family in FAMILIES {
        let model = Model::from_dir(&fixture(family), &dev).unwrap();
        let r = reference(family);
        let prompts = rows(&r["input_ids"]);
        let greedy = rows(&r["greedy_ids"]);
        for (i, (prompt, want)) in prompts.iter().zip(&greedy).enumerate() {
            let mut streamed = (Vec::new(), String::new());
            let g = model
                .generate(prompt, want.len(), &SamplingConfig::default(), &[], |id, text| {
                    streamed.0.push(id);
                    streamed.1.push_str(text);
                    Ok(())
                })
                .unwrap();
            assert_eq!(&g.ids, want, "{family} prompt {i}");
            assert_eq!(g.stop_reason, StopReason::Length);
            assert_eq!(g.text, r["greedy_text"][i].as_str().unwrap(), "{family} prompt {i}");
            assert_eq!(streamed.0, g.ids, "every id reaches the callback");
            assert!(
                g.text.starts_with(&streamed.1),
                "streamed text is a prefix of the final text"
            );
            assert_eq!(g.prompt_tokens, prompt.len());
            assert!(g.prefill_tokens_per_sec() > 0.0 && g.decode_tokens_per_sec() > 0.0);
        }
    }
}

#[test]
fn generation_stops_on_eos_and_stop_strings() {
    let dev = dev();
    let model = Model::from_dir(&fixture("llama"), &dev).unwrap();
    assert_eq!(model.eos_ids, [1]);
    let r = reference("llama");
    let prompt = &rows(&r["input_ids"])[0];
    let greedy = &rows(&r["greedy_ids"])[0];
    let greedy_text = r["greedy_text"][0].as_str().unwrap();
    let tokenizer = model.tokenizer().unwrap();

    // EOS: the 4th greedy token made an end-of-sequence id stops after it, keeping it.
    let stop = StopConditions {
        eos_ids: vec![greedy[3]],
        stop_strings: vec![],
        tokenizer: Some(tokenizer),
    };
    let g = generate(&model.lm, prompt, 12, &SamplingConfig::default(), &stop, |_, _| Ok(())).unwrap();
    assert_eq!(g.stop_reason, StopReason::Eos);
    assert_eq!(g.ids, greedy[..4]);
    // However many tokens are allowed: the cache grows as they come, not sized for all of them first (a buffer
    // for 2^22 positions failed before the first token; usize::MAX overflowed).
    for limit in [1 << 22, usize::MAX] {
        let g = generate(&model.lm, prompt, limit, &SamplingConfig::default(), &stop, |_, _| {
            Ok(())
        })
        .unwrap();
        assert_eq!(g.ids, greedy[..4], "at most {limit} tokens");
    }

    // A stop string: generation ends with the token that completes its first occurrence.
    let needle = "thj";
    assert!(greedy_text.contains(needle));
    let g = model
        .generate(prompt, 12, &SamplingConfig::default(), &[needle.to_string()], |_, _| {
            Ok(())
        })
        .unwrap();
    assert_eq!(g.stop_reason, StopReason::StopString);
    assert_eq!(g.ids, greedy[..g.ids.len()]);
    assert_eq!(g.text, tokenizer.decode(&g.ids, true).unwrap());
    assert!(g.text.contains(needle), "{:?}", g.text);
    let before = tokenizer.decode(&g.ids[..g.ids.len() - 1], true).unwrap();
    assert!(!before.contains(needle), "stopped late: {before:?}");

    // No new tokens asked for: nothing generated.
    let g = model
        .generate(prompt, 0, &SamplingConfig::default(), &[], |_, _| Ok(()))
        .unwrap();
    assert!(g.ids.is_empty());

    // NaN logits are an error on the greedy (GPU) path as on the sampling (host) path, not a token.
    let mut broken = Model::from_dir(&fixture("llama"), &dev).unwrap();
    let width = broken.lm.norm.width().unwrap();
    broken.lm.norm.weight = Some(Tensor::full(&[width], f64::NAN, DType::F32, &dev).unwrap());
    let hot = SamplingConfig {
        temperature: 0.7,
        ..SamplingConfig::default()
    };
    for sampling in [SamplingConfig::default(), hot] {
        let err = broken
            .generate(prompt, 4, &sampling, &[], |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("NaN"), "{sampling:?}: {err}");
    }
}

/// generation_config.json sets how the model picks tokens, as transformers' generate() reads it: greedy unless
/// do_sample, transformers' defaults (temperature 1, top-k 50) for what a sampling file leaves out, the
/// repetition penalty either way; settings not applied here load with a warning; bad values are errors naming
/// the file and the key.
#[test]
fn generation_config_json_sets_the_defaults() {
    let dev = dev();
    let dir = tmpdir("generation-config");
    for entry in std::fs::read_dir(fixture("llama")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let with = |json: &str| {
        std::fs::write(dir.join("generation_config.json"), json).unwrap();
        Model::from_dir(&dir, &dev)
    };
    let qwen_like = with(
        r#"{"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
            "eos_token_id": [1, 2], "num_beams": 1}"#,
    )
    .unwrap();
    assert_eq!(
        qwen_like.sampling,
        SamplingConfig {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.8,
            min_p: 0.0,
            repetition_penalty: 1.05,
            seed: 0
        }
    );
    assert_eq!(qwen_like.eos_ids, [1, 2]);
    let sampled = with(r#"{"do_sample": true, "no_repeat_ngram_size": 3}"#).unwrap();
    assert_eq!((sampled.sampling.temperature, sampled.sampling.top_k), (1.0, 50));
    let greedy = with(r#"{"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.3}"#).unwrap();
    assert_eq!(
        greedy.sampling,
        SamplingConfig {
            repetition_penalty: 1.3,
            ..SamplingConfig::default()
        }
    );
    // The penalty changes greedy tokens: the model's defaults are what generate() is given.
    let r = reference("llama");
    let prompt = &rows(&r["input_ids"])[0];
    let plain = greedy
        .generate(prompt, 12, &SamplingConfig::default(), &[], |_, _| Ok(()))
        .unwrap();
    let penalized = greedy
        .generate(prompt, 12, &greedy.sampling, &[], |_, _| Ok(()))
        .unwrap();
    assert_eq!(plain.ids, rows(&r["greedy_ids"])[0]);
    assert_ne!(penalized.ids, plain.ids);
    for (json, key) in [
        (r#"{"do_sample": "yes"}"#, "do_sample"),
        (r#"{"do_sample": true, "top_p": 2}"#, "top_p"),
        (r#"{"do_sample": true, "top_k": 2.5}"#, "top_k"),
        (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
        (r#"{"eos_token_id": "</s>"}"#, "eos_token_id"),
        (r#"[1, 2]"#, "object"),
        (r#"{"do_sample": tru"#, "malformed"),
    ] {
        let err = with(json).unwrap_err().to_string();
        assert!(
            err.contains("generation_config.json") && err.contains(key),
            "{json}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Past the first stretch of positions the cache holds room for, it grows (copying what it holds): 300 greedy
/// tokens equal those of a cache sized for all of them at once, step by step.
#[test]
fn the_cache_grows_as_generation_goes_on() {
    let dev = dev();
    let model = Model::from_dir(&fixture("llama"), &dev).unwrap();
    let prompt = &rows(&reference("llama")["input_ids"])[0];
    let n = 300;
    let g = greedy_without_stops(&model, prompt, n);
    let mut cache = model.lm.new_cache(1, prompt.len() + n).unwrap();
    let mut ids = Tensor::from_slice(prompt, &[1, prompt.len()], &dev).unwrap();
    let mut want = Vec::new();
    for _ in 0..n {
        let logits = hierarchos::core::no_grad(|| model.lm.forward_last(&ids, Some(&mut cache))).unwrap();
        let id = argmax(&logits.to_vec::<f32>().unwrap()) as u32;
        want.push(id);
        ids = Tensor::from_slice(&[id], &[1, 1], &dev).unwrap();
    }
    assert_eq!(g, want);
}

/// `n` greedy tokens after `prompt` through `generate`, with nothing to stop them.
fn greedy_without_stops(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let no_stop = StopConditions {
        eos_ids: vec![],
        stop_strings: vec![],
        tokenizer: None,
    };
    generate(
        &model.lm,
        prompt,
        n,
        &SamplingConfig::default(),
        &no_stop,
        |_, _| Ok(()),
    )
    .unwrap()
    .ids
}

/// Phi-3 under LongRoPE: when the sequence passes the pretraining length (16 in the fixture) during generation,
/// transformers throws the cache away and runs the whole sequence again, so that the cached keys too rotate by
/// the long factors; each token is then the greedy token of a forward over the whole prefix.
#[test]
fn phi3_recomputes_its_cache_past_the_pretraining_length() {
    let dev = dev();
    let model = Model::from_dir(&fixture("phi3_longrope"), &dev).unwrap();
    assert_eq!(model.config.cache_reset_length(), Some(17));
    let full = &rows(&reference("phi3_longrope")["input_ids"])[0];
    // Past the reset too: 20 positions in all.
    for prompt_len in [5, 16] {
        let prompt = &full[..prompt_len];
        let n = 20 - prompt_len;
        let mut seq = prompt.to_vec();
        for _ in 0..n {
            let ids = Tensor::from_slice(&seq, &[1, seq.len()], &dev).unwrap();
            let logits = hierarchos::core::no_grad(|| model.lm.forward_last(&ids, None)).unwrap();
            seq.push(argmax(&logits.to_vec::<f32>().unwrap()) as u32);
        }
        assert_eq!(
            greedy_without_stops(&model, prompt, n),
            seq[prompt_len..],
            "prompt of {prompt_len}"
        );
    }
}

#[test]
fn seeded_generation_is_reproducible() {
    let dev = dev();
    let model = Model::load(fixture("qwen3").to_str().unwrap(), None, &dev).unwrap();
    let prompt = model.encode_prompt("Call me", false).unwrap();
    let sampling = |seed| SamplingConfig {
        temperature: 1.5,
        top_k: 50,
        top_p: 0.95,
        min_p: 0.01,
        repetition_penalty: 1.1,
        seed,
    };
    let run = |seed| {
        model
            .generate(&prompt, 10, &sampling(seed), &[], |_, _| Ok(()))
            .unwrap()
            .ids
    };
    let a = run(42);
    assert_eq!(a.len(), 10);
    assert_eq!(a, run(42));
    assert!((0..5).any(|s| run(s) != a), "other seeds give other samples");
}

#[test]
fn bad_generation_requests_are_errors() {
    let dev = dev();
    let model = Model::from_dir(&fixture("mistral"), &dev).unwrap();
    let none = SamplingConfig::default();
    assert!(model.generate(&[], 4, &none, &[], |_, _| Ok(())).is_err());
    assert!(model.generate(&[0, 300], 4, &none, &[], |_, _| Ok(())).is_err());
    let stop = StopConditions {
        stop_strings: vec!["x".into()],
        ..Default::default()
    };
    assert!(
        generate(&model.lm, &[0, 5], 4, &none, &stop, |_, _| Ok(())).is_err(),
        "stop strings need a tokenizer"
    );
    let bad = SamplingConfig {
        top_p: 2.0,
        ..Default::default()
    };
    assert!(model.generate(&[0, 5], 4, &bad, &[], |_, _| Ok(())).is_err());
    // A callback error ends generation and is returned.
    let err = model
        .generate(&[0, 5], 4, &none, &[], |_, _| {
            Err(hierarchos::nn::Error::Invalid("stop here".into()))
        })
        .unwrap_err();
    assert!(err.to_string().contains("stop here"));
}
