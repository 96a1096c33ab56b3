//! `hierarchos forward` and `hierarchos generate` on the reference fixtures: logits against transformers' float64
//! ones, greedy ids, the JSON line, streaming, sampling flags, and errors that name the file at fault.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hierarchos_nn::{ChatMessage, Tokenizer, Weights};
use serde_json::Value;

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(family)
}

fn reference(family: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(family).join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hierarchos-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The CLI as a command, offline, started through cargo's target runner where one is set, as cargo starts this
/// test (`scripts/lavapipe_coop.sh` runs both on a newer C library through its loader).
fn cli() -> Command {
    let bin = env!("CARGO_BIN_EXE_hierarchos");
    let runner = std::env::var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    command.env("HF_HUB_OFFLINE", "1");
    command
}

fn hierarchos(args: &[&str]) -> Output {
    cli().args(args).output().expect("running hierarchos")
}

/// Runs and expects success; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = hierarchos(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hierarchos {args:?} failed:\n{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Runs and expects failure; returns stderr.
fn fails(args: &[&str]) -> String {
    let out = hierarchos(args);
    assert!(!out.status.success(), "hierarchos {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON object on the last stdout line.
fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().expect("no output")).expect("last line is JSON")
}

/// `dir/rows.jsonl`: 8 rows of 12 `input_ids` (`(row * a + i * b) % 300`).
fn token_rows(dir: &Path, a: u32, b: u32) -> PathBuf {
    let data = dir.join("rows.jsonl");
    let rows: Vec<String> = (0..8u32)
        .map(|r| {
            let ids: Vec<u32> = (0..12).map(|i| (r * a + i * b) % 300).collect();
            serde_json::json!({ "input_ids": ids }).to_string()
        })
        .collect();
    std::fs::write(&data, rows.join("\n")).unwrap();
    data
}

fn read_logits(path: &Path, shape: &[usize]) -> Vec<f32> {
    Weights::from_bytes(std::fs::read(path).unwrap(), path)
        .unwrap()
        .read_f32("logits", shape)
        .unwrap()
}

#[test]
fn forward_writes_the_reference_logits() {
    let dir = scratch("forward");
    for family in ["llama", "qwen3"] {
        let model = fixture(family);
        let r = reference(family);
        let prompt = ids(&r["input_ids"][1]);
        let t = prompt.len();
        let reference = Weights::from_bytes(
            std::fs::read(model.join("reference.safetensors")).unwrap(),
            &model.join("reference.safetensors"),
        )
        .unwrap()
        .read_f32("logits", &[2, t, 300])
        .unwrap();
        let want = &reference[t * 300..];

        let out = dir.join(format!("{family}-ids.safetensors"));
        ok(&[
            "forward",
            "-m",
            model.to_str().unwrap(),
            "--ids",
            &csv(&prompt),
            "-o",
            out.to_str().unwrap(),
        ]);
        let got = read_logits(&out, &[t, 300]);
        let err = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 2e-5, "{family}: max |logit - reference| = {err}");

        // --text tokenizes to the same ids.
        let text_out = dir.join(format!("{family}-text.safetensors"));
        let text = r["prompts"][1].as_str().unwrap();
        ok(&[
            "forward",
            "-m",
            model.to_str().unwrap(),
            "--text",
            text,
            "-o",
            text_out.to_str().unwrap(),
        ]);
        assert_eq!(read_logits(&text_out, &[t, 300]), got);
    }
}

#[test]
fn generate_streams_greedy_tokens_and_ends_with_json() {
    for family in ["llama", "qwen2"] {
        let model = fixture(family);
        let r = reference(family);
        let want_ids = ids(&r["greedy_ids"][0]);
        let want_text = r["greedy_text"][0].as_str().unwrap();
        let m = model.to_str().unwrap();

        let from_ids = hierarchos(&[
            "generate",
            "-m",
            m,
            "--ids",
            &csv(&ids(&r["input_ids"][0])),
            "-n",
            "12",
            "--json",
        ]);
        assert!(
            from_ids.status.success(),
            "{}",
            String::from_utf8_lossy(&from_ids.stderr)
        );
        let stdout = String::from_utf8(from_ids.stdout).unwrap();
        let json = last_json(&stdout);
        assert_eq!(ids(&json["ids"]), want_ids, "{family}");
        assert_eq!(json["text"], want_text, "{family}");
        assert_eq!(json["stop_reason"], "length");
        assert!(
            stdout.starts_with(want_text),
            "the text is streamed before the JSON line: {stdout:?}"
        );
        let stderr = String::from_utf8_lossy(&from_ids.stderr);
        assert!(stderr.contains("tokens/s"), "{stderr}");

        // -p tokenizes the prompt as transformers did.
        let prompt = r["prompts"][0].as_str().unwrap();
        let json = last_json(&ok(&[
            "generate",
            "-m",
            m,
            "-p",
            prompt,
            "-n",
            "12",
            "--temperature",
            "0",
            "--json",
        ]));
        assert_eq!(ids(&json["ids"]), want_ids, "{family}");

        // Without --json, stdout is the text alone.
        let plain = ok(&["generate", "-m", m, "-p", prompt, "-n", "12"]);
        assert_eq!(plain, format!("{want_text}\n"));
    }
}

#[test]
fn generate_sampling_chat_and_stop_flags() {
    let model = fixture("mistral");
    let m = model.to_str().unwrap();
    let sample = |seed: &str| {
        let args = [
            "generate",
            "-m",
            m,
            "-p",
            "The",
            "-n",
            "8",
            "--temperature",
            "1.2",
            "--top-k",
            "40",
            "--top-p",
            "0.9",
            "--min-p",
            "0.02",
            "--repetition-penalty",
            "1.2",
            "--seed",
            seed,
            "--json",
        ];
        ids(&last_json(&ok(&args))["ids"])
    };
    let a = sample("11");
    assert_eq!(a.len(), 8);
    assert_eq!(a, sample("11"));

    // Settings left out come from the model's generation_config.json, as transformers' generate() takes them;
    // flags win over it.
    let dir = scratch("generation-config");
    for entry in std::fs::read_dir(&model).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"do_sample": true, "temperature": 1.2, "top_k": 40, "top_p": 0.9, "min_p": 0.02,
            "repetition_penalty": 1.2}"#,
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    let json = last_json(&ok(&[
        "generate", "-m", d, "-p", "The", "-n", "8", "--seed", "11", "--json",
    ]));
    assert_eq!(ids(&json["ids"]), a);
    let greedy = |m: &str, extra: &[&str]| {
        let mut args = vec!["generate", "-m", m, "-p", "The", "-n", "8", "--json"];
        args.extend_from_slice(extra);
        ids(&last_json(&ok(&args))["ids"])
    };
    assert_eq!(
        greedy(d, &["--temperature", "0", "--repetition-penalty", "1"]),
        greedy(m, &[])
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // --chat sends the prompt through the chat template as one user message.
    let json = last_json(&ok(&["generate", "-m", m, "-p", "Why?", "--chat", "-n", "3", "--json"]));
    let tok = Tokenizer::from_dir(&model).unwrap();
    let rendered = tok
        .apply_chat_template(&[ChatMessage::new("user", "Why?")], true)
        .unwrap();
    assert_eq!(ids(&json["prompt_ids"]), tok.encode(&rendered, false).unwrap());

    // --stop ends at the first occurrence of a stop string in the greedy text.
    let r = reference("mistral");
    let greedy_text = r["greedy_text"][0].as_str().unwrap();
    let stop: String = greedy_text.chars().skip(2).take(2).collect();
    let prompt = r["prompts"][0].as_str().unwrap();
    let json = last_json(&ok(&[
        "generate", "-m", m, "-p", prompt, "-n", "12", "--stop", &stop, "--json",
    ]));
    assert_eq!(json["stop_reason"], "stop_string");
    let text = json["text"].as_str().unwrap();
    assert!(
        text.contains(&stop) && greedy_text.starts_with(text),
        "{text:?} / {greedy_text:?}"
    );
}

#[test]
fn errors_name_the_file_at_fault() {
    let dir = scratch("errors");
    let d = dir.to_str().unwrap();
    let llama = fixture("llama");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(llama.join(file), dir.join(file)).unwrap();
    }
    // No tokenizer: text prompts fail naming tokenizer.json, ids still work (the stream is the ids).
    let err = fails(&["generate", "-m", d, "-p", "hello", "-n", "2"]);
    assert!(err.contains("tokenizer.json"), "{err}");
    let out = ok(&["generate", "-m", d, "--ids", "0,34,77", "-n", "2", "--json"]);
    let json = last_json(&out);
    assert_eq!(json["ids"].as_array().unwrap().len(), 2);
    assert!(json["text"].is_null());
    let err = fails(&[
        "forward",
        "-m",
        d,
        "--text",
        "hi",
        "-o",
        dir.join("x.safetensors").to_str().unwrap(),
    ]);
    assert!(err.contains("tokenizer.json"), "{err}");

    std::fs::write(dir.join("config.json"), "{\"model_type\": ").unwrap();
    let err = fails(&["generate", "-m", d, "--ids", "1", "-n", "1"]);
    assert!(err.contains("config.json"), "{err}");

    let err = fails(&["generate", "-m", "/nonexistent/model/folder", "--ids", "1"]);
    assert!(err.contains("/nonexistent/model/folder"), "{err}");
    let err = fails(&["generate", "-m", llama.to_str().unwrap(), "--ids", "1,300", "-n", "1"]);
    assert!(err.contains("300"), "{err}");
    // A negative number is a value out of range, not an unknown flag.
    let err = fails(&[
        "generate",
        "-m",
        llama.to_str().unwrap(),
        "--ids",
        "1",
        "--temperature",
        "-1",
    ]);
    assert!(err.contains("temperature") && err.contains("-1"), "{err}");
    let err = fails(&[
        "generate",
        "-m",
        llama.to_str().unwrap(),
        "--ids",
        "1",
        "--top-p",
        "1.5",
    ]);
    assert!(err.contains("top_p"), "{err}");
    let err = fails(&[
        "forward",
        "-m",
        llama.to_str().unwrap(),
        "--ids",
        "1",
        "--text",
        "a",
        "-o",
        "x",
    ]);
    assert!(err.contains("cannot be used with"), "{err}");
    fails(&["generate", "-m", llama.to_str().unwrap()]);
}

#[test]
fn train_saves_resumes_exactly_and_evaluates() {
    let dir = scratch("train");
    let data = token_rows(&dir, 37, 11);
    let model = fixture("llama");
    let run = |out: &Path, steps: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--data",
            data.to_str().unwrap(),
            "--steps",
            steps,
            "--batch-size",
            "2",
            "--seq-len",
            "12",
            "--lr",
            "1e-3",
            "--warmup-steps",
            "1",
            "--save-every",
            "2",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ok(&args);
    };
    let straight = dir.join("straight");
    let metrics = dir.join("metrics.jsonl");
    run(
        &straight,
        "4",
        &["-m", model.to_str().unwrap(), "--metrics", metrics.to_str().unwrap()],
    );
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "checkpoint-2",
        "checkpoint-4",
    ] {
        assert!(straight.join(file).exists(), "{file} missing");
    }
    let steps: Vec<Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let numbers: Vec<u64> = steps.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(
        numbers,
        [1, 2, 3, 4],
        "each step once, in order (read back while the next runs)"
    );
    assert!(steps.iter().all(|s| s["loss"].as_f64().unwrap().is_finite()));
    assert_eq!(
        steps[0]["lr"].as_f64(),
        Some(0.0),
        "warmup starts at 0, as transformers' schedules do"
    );

    // Two steps, then a resumed run to four: the same final weights, byte for byte.
    let halves = dir.join("halves");
    run(&halves, "2", &["-m", model.to_str().unwrap()]);
    run(&halves, "4", &["--resume", halves.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(halves.join("model.safetensors")).unwrap(),
        std::fs::read(straight.join("model.safetensors")).unwrap()
    );

    // Resuming from a given checkpoint folder without --steps runs to the run's own end (4): the same model again.
    let again = dir.join("again");
    ok(&[
        "train",
        "--resume",
        straight.join("checkpoint-2").to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(again.join("model.safetensors")).unwrap(),
        std::fs::read(straight.join("model.safetensors")).unwrap()
    );

    let out = ok(&[
        "eval",
        "-m",
        straight.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--seq-len",
        "12",
    ]);
    assert!(out.contains("loss") && out.contains("perplexity"), "{out}");

    let missing = dir.join("missing.txt");
    let err = fails(&[
        "train",
        "-m",
        model.to_str().unwrap(),
        "--data",
        missing.to_str().unwrap(),
        "--out",
        dir.join("x").to_str().unwrap(),
    ]);
    assert!(err.contains("missing.txt"), "{err}");
    let err = fails(&[
        "train",
        "--resume",
        dir.to_str().unwrap(),
        "--out",
        dir.join("y").to_str().unwrap(),
    ]);
    assert!(err.contains("no checkpoint"), "{err}");
    // Fewer steps than the resumed run has taken: refused, the checkpoint left as it was.
    let before = std::fs::read(straight.join("checkpoint-2/trainer_state.json")).unwrap();
    let err = fails(&[
        "train",
        "--resume",
        straight.join("checkpoint-2").to_str().unwrap(),
        "--steps",
        "1",
        "--out",
        straight.to_str().unwrap(),
    ]);
    assert!(err.contains("already taken 2 steps"), "{err}");
    assert_eq!(
        std::fs::read(straight.join("checkpoint-2/trainer_state.json")).unwrap(),
        before
    );
}

/// A diverging run (a learning rate of 1e30 after a first step at 0) stops with the step that met the
/// non-finite loss, whether it was read back while the next step ran or at a checkpoint, names the checkpoint it
/// keeps, and logs every step before it once.
#[test]
fn a_diverging_run_stops_with_its_step_and_keeps_the_last_checkpoint() {
    let dir = scratch("diverge");
    let data = token_rows(&dir, 37, 11);
    let out = dir.join("run");
    let metrics = dir.join("metrics.jsonl");
    let err = fails(&[
        "train",
        "-m",
        fixture("qwen2").to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--steps",
        "10",
        "--batch-size",
        "2",
        "--seq-len",
        "12",
        "--lr",
        "1e30",
        "--warmup-steps",
        "1",
        "--lr-scheduler",
        "constant",
        "--max-grad-norm",
        "0",
        "--save-every",
        "2",
        "--metrics",
        metrics.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let step: usize = err
        .split("step ")
        .filter_map(|s| s.split(':').next()?.parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no failing step in: {err}"));
    assert!(step > 2 && err.contains("training stopped"), "{err}");
    let kept = (step - 1) / 2 * 2;
    assert!(err.contains(&format!("the checkpoint of step {kept} is kept")), "{err}");
    assert!(out.join(format!("checkpoint-{kept}")).is_dir());
    assert!(!out.join(format!("checkpoint-{}", kept + 2)).exists());
    let logged: Vec<u64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(logged, (1..step as u64).collect::<Vec<_>>(), "{err}");
}

#[test]
fn a_killed_run_leaves_only_whole_checkpoints_and_resumes() {
    let dir = scratch("kill");
    let data = dir.join("rows.jsonl");
    let rows: Vec<String> = (0..6u32)
        .map(|r| {
            let ids: Vec<u32> = (0..10).map(|i| (r * 13 + i * 7) % 300).collect();
            serde_json::json!({ "input_ids": ids }).to_string()
        })
        .collect();
    std::fs::write(&data, rows.join("\n")).unwrap();
    let out = dir.join("out");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "train",
            "--data",
            data.to_str().unwrap(),
            "--batch-size",
            "2",
            "--seq-len",
            "10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(
            [
                "--save-every",
                "1",
                "--save-total-limit",
                "0",
                "--out",
                out.to_str().unwrap(),
            ]
            .map(String::from),
        );
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // Saving every step, the process is killed (SIGKILL) once its first checkpoint exists, very likely in the middle
    // of writing a later one.
    let model = fixture("llama");
    let mut child = cli()
        .args(args(&["-m", model.to_str().unwrap(), "--steps", "1000"]))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !out.join("checkpoint-1").exists() {
        assert!(start.elapsed().as_secs() < 120, "no checkpoint appeared");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
    // Every checkpoint folder is whole: it evaluates, and the newest one resumes to the end of a short run.
    let mut done = Vec::new();
    for entry in std::fs::read_dir(&out).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(step) = name.strip_prefix("checkpoint-") {
            done.push(step.parse::<usize>().unwrap());
            ok(&[
                "eval",
                "-m",
                entry.path().to_str().unwrap(),
                "--data",
                data.to_str().unwrap(),
                "--seq-len",
                "10",
            ]);
        }
    }
    let last = *done.iter().max().expect("at least one checkpoint");
    let end = (last + 2).to_string();
    ok(&args(&["--resume", out.to_str().unwrap(), "--steps", &end])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert!(out.join(format!("checkpoint-{end}")).join("model.safetensors").exists());
}

/// A LoRA run: train writes PEFT adapter folders and resumes them bit for bit (dropout on, base in bf16);
/// `--adapter` continues a PEFT adapter and applies one to `forward`; `merge` writes a plain model with the same
/// logits as the base plus the adapter.
#[test]
fn lora_trains_resumes_applies_and_merges() {
    let dir = scratch("lora");
    let data = token_rows(&dir, 41, 13);
    let model = fixture("qwen2");
    let common = [
        "train",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "2",
        "--seq-len",
        "12",
        "--lr",
        "1e-2",
        "--save-every",
        "2",
    ];
    let lora = [
        "-m",
        model.to_str().unwrap(),
        "--lora-r",
        "4",
        "--lora-alpha",
        "16",
        "--lora-dropout",
        "0.2",
        "--lora-targets",
        "all-linear",
        "--base-dtype",
        "bf16",
    ];
    let run = |out: &Path, steps: &str, extra: &[&str]| {
        let mut args = common.to_vec();
        args.extend(["--steps", steps, "--out", out.to_str().unwrap()]);
        args.extend_from_slice(extra);
        ok(&args);
    };
    let straight = dir.join("straight");
    run(&straight, "4", &lora);
    for file in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "checkpoint-4",
    ] {
        assert!(straight.join(file).exists(), "{file} missing");
    }
    assert!(
        !straight.join("model.safetensors").exists(),
        "an adapter run writes no model"
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(straight.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(
        config["target_modules"].as_array().unwrap().len(),
        14,
        "all-linear spelled out"
    );
    // Resuming from step 2 (a fresh process loading the base, the adapter and the moments) ends with the same
    // adapter, byte for byte.
    let resumed = dir.join("resumed");
    ok(&[
        "train",
        "--resume",
        straight.join("checkpoint-2").to_str().unwrap(),
        "--out",
        resumed.to_str().unwrap(),
    ]);
    let adapter = |d: &Path| std::fs::read(d.join("adapter_model.safetensors")).unwrap();
    assert!(
        adapter(&resumed) == adapter(&straight),
        "2 steps + 2 resumed != 4 steps"
    );

    // The fixture's PEFT adapter, continued for two steps, then applied and merged.
    let peft = fixture("qwen2").join("lora");
    let continued = dir.join("continued");
    run(
        &continued,
        "2",
        &["-m", model.to_str().unwrap(), "--adapter", peft.to_str().unwrap()],
    );
    let ids = ids(&reference("qwen2")["input_ids"][0]);
    let id_list = csv(&ids);
    let logits = |args: &[&str], name: &str| {
        let path = dir.join(name);
        let mut all = vec!["forward", "--ids", &id_list, "-o", path.to_str().unwrap()];
        all.extend_from_slice(args);
        ok(&all);
        read_logits(&path, &[ids.len(), 300])
    };
    // The PEFT-trained fixture adapter as is: PEFT's float64 logits of the first prompt.
    let peft_logits = logits(
        &["-m", model.to_str().unwrap(), "--adapter", peft.to_str().unwrap()],
        "peft.safetensors",
    );
    let want = Weights::open_file(&fixture("qwen2").join("reference.safetensors"))
        .unwrap()
        .read_f32("lora/logits", &[2, ids.len(), 300])
        .unwrap();
    let worst = peft_logits
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 2e-5,
        "forward --adapter is {worst:e} from PEFT's float64 logits"
    );
    let applied = logits(
        &["-m", model.to_str().unwrap(), "--adapter", continued.to_str().unwrap()],
        "applied.safetensors",
    );
    let base = logits(&["-m", model.to_str().unwrap()], "base.safetensors");
    let merged_dir = dir.join("merged");
    ok(&[
        "merge",
        "-m",
        model.to_str().unwrap(),
        "--adapter",
        continued.to_str().unwrap(),
        "--out",
        merged_dir.to_str().unwrap(),
    ]);
    let merged = logits(&["-m", merged_dir.to_str().unwrap()], "merged.safetensors");
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(
        diff(&merged, &applied) <= 2e-5,
        "merged vs applied {}",
        diff(&merged, &applied)
    );
    assert!(diff(&base, &applied) > 1e-2, "the adapter changes the logits");

    let err = fails(&[
        "train",
        "-m",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--base-dtype",
        "f16",
        "--out",
        dir.join("x").to_str().unwrap(),
    ]);
    assert!(err.contains("--lora-r"), "{err}");
    let err = fails(&[
        "generate",
        "-m",
        model.to_str().unwrap(),
        "--adapter",
        dir.join("nowhere").to_str().unwrap(),
        "-p",
        "a",
    ]);
    assert!(err.contains("adapter_config.json"), "{err}");
}

/// `hierarchos archs --json` lists every registered architecture with its status, and `--markdown` prints
/// ARCHITECTURES.md as the repository holds it.
#[test]
fn archs_lists_the_registry() {
    let out = hierarchos(&["archs", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), hierarchos_nn::ARCHITECTURES.len());
    for (entry, arch) in list.iter().zip(&hierarchos_nn::ARCHITECTURES) {
        assert_eq!(entry["model_type"], arch.family.model_type());
        assert_eq!(entry["status"], arch.status.name());
        assert_eq!(entry["fixtures"].as_array().unwrap().len(), arch.fixtures.len());
    }
    assert!(
        list.iter()
            .any(|e| e["model_type"] == "qwen3" && e["status"] == "validated")
    );
    let out = hierarchos(&["archs", "--markdown"]);
    let file = std::fs::read_to_string(fixture("../../ARCHITECTURES.md")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), file);
}
