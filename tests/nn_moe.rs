//! The mixture-of-experts block on its own: routing, weighting and gradients against a float64 CPU reference,
//! beyond the tiny-model parity of the MoE fixtures; and the MoE settings of config.json.

mod common;
use std::path::Path;

use common::*;
use hierarchos::core::{Tensor, no_grad};
use hierarchos::nn::{Activation, Linear, LinearWeight, Mlp, ModelConfig, Moe, RouterScoring, SharedExpert};

/// One block's shape and routing settings.
#[derive(Clone, Copy, Debug)]
struct Case {
    tokens: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
    width: usize,
    normalize: bool,
    /// Width of a shared expert.
    shared: Option<usize>,
    /// The shared expert's output is scaled by a sigmoid gate (Qwen2-MoE), or not (DeepSeek-V3).
    shared_gated: bool,
    /// `None`: a softmax router; `Some((groups, top_groups))`: DeepSeek-V3's sigmoid router, its correction bias
    /// and its choice among the best groups.
    grouped: Option<(usize, usize)>,
    /// Multiplies the chosen weights.
    scaling: f64,
}

/// The block's values: `x` `[tokens, hidden]`, the router `[experts, hidden]`, each expert's gate, up
/// (`[width, hidden]`) and down (`[hidden, width]`), the shared expert's three and its gate `[1, hidden]`.
#[derive(Clone)]
struct Values {
    x: Vec<f32>,
    router: Vec<f32>,
    experts: Vec<[Vec<f32>; 3]>,
    shared: Option<([Vec<f32>; 3], Vec<f32>)>,
    /// The sigmoid router's correction bias `[experts]` (a buffer: no gradient).
    bias: Vec<f32>,
}

fn values(rng: &mut Rng, c: Case) -> Values {
    let mlp = |rng: &mut Rng, width: usize| {
        [
            rng.vec(width * c.hidden, -0.6, 0.6),
            rng.vec(width * c.hidden, -0.6, 0.6),
            rng.vec(c.hidden * width, -0.6, 0.6),
        ]
    };
    Values {
        x: rng.vec(c.tokens * c.hidden, -1.0, 1.0),
        router: rng.vec(c.experts * c.hidden, -1.0, 1.0),
        experts: (0..c.experts).map(|_| mlp(rng, c.width)).collect(),
        shared: c.shared.map(|w| (mlp(rng, w), rng.vec(c.hidden, -1.0, 1.0))),
        bias: rng.vec(c.experts, -0.3, 0.3),
    }
}

/// `W v` for a row-major `[rows, v.len()]` matrix.
fn matvec(w: &[f64], v: &[f64]) -> Vec<f64> {
    w.chunks_exact(v.len())
        .map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum())
        .collect()
}

/// A gated SiLU MLP on one token.
fn mlp64(p: &[Vec<f64>; 3], x: &[f64]) -> Vec<f64> {
    let (g, u) = (matvec(&p[0], x), matvec(&p[1], x));
    let h: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
    matvec(&p[2], &h)
}

/// The block in float64, token by token: the router's scores (a softmax; or a sigmoid, plus the correction
/// `bias` for choosing, restricted to the `top_groups` groups whose two best sum highest), the `top_k` best
/// experts (their scores renormalized when the case says, times the case's scaling), their outputs weighted and
/// summed, plus the shared expert (gated when the case says).
fn reference(c: Case, v: &[Vec<f64>], bias: &[f32]) -> Vec<f64> {
    let (x, router) = (&v[0], &v[1]);
    let expert = |e: usize| -> [Vec<f64>; 3] { [v[2 + 3 * e].clone(), v[3 + 3 * e].clone(), v[4 + 3 * e].clone()] };
    let desc = |s: &[f64]| {
        let mut ranked: Vec<usize> = (0..s.len()).collect();
        ranked.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        ranked
    };
    let mut out = Vec::with_capacity(x.len());
    for t in x.chunks_exact(c.hidden) {
        let logits = matvec(router, t);
        let (scores, allowed): (Vec<f64>, Vec<usize>) = match c.grouped {
            None => {
                let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                let exp: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let total: f64 = exp.iter().sum();
                (exp.iter().map(|e| e / total).collect(), (0..c.experts).collect())
            }
            Some((groups, top_groups)) => {
                let scores: Vec<f64> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
                let choice: Vec<f64> = scores.iter().zip(bias).map(|(s, &b)| s + b as f64).collect();
                let per = c.experts / groups;
                let sums: Vec<f64> = choice
                    .chunks_exact(per)
                    .map(|g| desc(g)[..2].iter().map(|&e| g[e]).sum())
                    .collect();
                let allowed = desc(&sums)[..top_groups]
                    .iter()
                    .flat_map(|&g| g * per..(g + 1) * per)
                    .collect();
                (scores, allowed)
            }
        };
        let for_choice: Vec<f64> = (0..c.experts)
            .map(|e| match (allowed.contains(&e), c.grouped) {
                (false, _) => f64::NEG_INFINITY,
                (true, Some(_)) => scores[e] + bias[e] as f64,
                (true, None) => scores[e],
            })
            .collect();
        let ranked = desc(&for_choice);
        let chosen = &ranked[..c.top_k];
        let norm: f64 = if c.normalize {
            chosen.iter().map(|&e| scores[e]).sum()
        } else {
            1.0
        };
        let mut y = vec![0.0; c.hidden];
        for &e in chosen {
            for (yi, oi) in y.iter_mut().zip(mlp64(&expert(e), t)) {
                *yi += scores[e] / norm * c.scaling * oi;
            }
        }
        if c.shared.is_some() {
            let base = 2 + 3 * c.experts;
            let shared = [v[base].clone(), v[base + 1].clone(), v[base + 2].clone()];
            let gate = match c.shared_gated {
                true => 1.0 / (1.0 + (-matvec(&v[base + 3], t)[0]).exp()),
                false => 1.0,
            };
            for (yi, oi) in y.iter_mut().zip(mlp64(&shared, t)) {
                *yi += gate * oi;
            }
        }
        out.extend(y);
    }
    out
}

/// The values with gradients in the order `reference` takes them: x, router, each expert's three, the shared
/// expert's three and its gate (when gated).
fn flat(c: Case, v: &Values) -> Vec<Vec<f32>> {
    let mut all = vec![v.x.clone(), v.router.clone()];
    for e in &v.experts {
        all.extend(e.iter().cloned());
    }
    if let Some((s, g)) = &v.shared {
        all.extend(s.iter().cloned());
        if c.shared_gated {
            all.push(g.clone());
        }
    }
    all
}

/// The block on the GPU, every tensor trainable; returns it with `x` and the tensors in `flat`'s order.
fn block(c: Case, v: &Values) -> (Moe, Vec<Tensor>) {
    let d = dev();
    let t = |data: &[f32], shape: &[usize]| Tensor::from_slice(data, shape, &d).unwrap().requires_grad_();
    let linear = |w: &Tensor| Linear {
        weight: LinearWeight::Dense(w.clone()),
        bias: None,
        lora: None,
        transposed: false,
    };
    let mut tensors = vec![t(&v.x, &[1, c.tokens, c.hidden]), t(&v.router, &[c.experts, c.hidden])];
    let mlp = |p: &[Vec<f32>; 3], width: usize, tensors: &mut Vec<Tensor>| {
        let ws = [
            t(&p[0], &[width, c.hidden]),
            t(&p[1], &[width, c.hidden]),
            t(&p[2], &[c.hidden, width]),
        ];
        tensors.extend(ws.iter().cloned());
        Mlp {
            gate_proj: Some(linear(&ws[0])),
            up_proj: linear(&ws[1]),
            down_proj: linear(&ws[2]),
            act: Activation::Silu,
            gate_up: None,
            fused_gate_up: None,
            names: ["gate_proj", "up_proj", "down_proj"],
        }
    };
    let experts = v.experts.iter().map(|p| mlp(p, c.width, &mut tensors)).collect();
    let shared = v.shared.as_ref().map(|(p, g)| {
        let mlp = mlp(p, c.shared.unwrap(), &mut tensors);
        let gate = c.shared_gated.then(|| {
            let gate = t(g, &[1, c.hidden]);
            tensors.push(gate.clone());
            linear(&gate)
        });
        SharedExpert {
            name: "shared_expert",
            mlp,
            gate,
        }
    });
    let moe = Moe {
        name: "mlp",
        gate: linear(&tensors[1]),
        experts,
        top_k: c.top_k,
        normalize_top_k: c.normalize,
        scoring: match c.grouped {
            None => RouterScoring::Softmax,
            Some((groups, top_groups)) => RouterScoring::GroupedSigmoid { groups, top_groups },
        },
        correction_bias: c
            .grouped
            .map(|_| Tensor::from_slice(&v.bias, &[c.experts], &d).unwrap()),
        routed_scaling_factor: c.scaling,
        shared_expert: shared,
    };
    (moe, tensors)
}

fn to64(v: &[Vec<f32>]) -> Vec<Vec<f64>> {
    v.iter().map(|x| x.iter().map(|&a| a as f64).collect()).collect()
}

const CASES: [Case; 6] = [
    // Mixtral-like: renormalized top 2.
    Case {
        tokens: 7,
        hidden: 8,
        experts: 4,
        top_k: 2,
        width: 6,
        normalize: true,
        shared: None,
        shared_gated: false,
        grouped: None,
        scaling: 1.0,
    },
    // Qwen2-MoE-like: raw probabilities, a shared expert.
    Case {
        tokens: 5,
        hidden: 8,
        experts: 5,
        top_k: 2,
        width: 4,
        normalize: false,
        shared: Some(6),
        shared_gated: true,
        grouped: None,
        scaling: 1.0,
    },
    // Top 3 of 8 over more tokens than experts.
    Case {
        tokens: 17,
        hidden: 4,
        experts: 8,
        top_k: 3,
        width: 3,
        normalize: true,
        shared: None,
        shared_gated: false,
        grouped: None,
        scaling: 1.0,
    },
    // One token, one expert: most experts get no token.
    Case {
        tokens: 1,
        hidden: 4,
        experts: 3,
        top_k: 1,
        width: 5,
        normalize: false,
        shared: None,
        shared_gated: false,
        grouped: None,
        scaling: 1.0,
    },
    // DeepSeek-V3-like: sigmoid scores, 2 of 4 groups of 2, then 3 experts, renormalized, scaled, an ungated
    // shared expert.
    Case {
        tokens: 9,
        hidden: 6,
        experts: 8,
        top_k: 3,
        width: 4,
        normalize: true,
        shared: Some(5),
        shared_gated: false,
        grouped: Some((4, 2)),
        scaling: 2.5,
    },
    // One group of all experts (DeepSeek-V2-Lite's layout), scores as they are.
    Case {
        tokens: 4,
        hidden: 5,
        experts: 4,
        top_k: 2,
        width: 3,
        normalize: false,
        shared: None,
        shared_gated: false,
        grouped: Some((1, 1)),
        scaling: 1.5,
    },
];

#[test]
fn routing_matches_a_float64_reference() {
    let mut rng = Rng::new("moe forward");
    for c in CASES {
        let v = values(&mut rng, c);
        let (moe, tensors) = block(c, &v);
        let got = no_grad(|| moe.forward(&tensors[0])).unwrap();
        assert_eq!(got.shape(), &[1, c.tokens, c.hidden]);
        let want = reference(c, &to64(&flat(c, &v)), &v.bias);
        assert_close(&format!("{c:?}"), &got.to_vec::<f32>().unwrap(), &want, 1e-4, 1e-5);
    }
}

/// Every gradient (input, router, experts, shared expert and its gate) against central differences of the
/// float64 reference; experts no token chose get zero gradients, present rather than absent (as the 3-D expert
/// tensors of transformers get them), so AdamW decays and moves them alike.
#[test]
fn gradients_match_float64_finite_differences() {
    let mut rng = Rng::new("moe backward");
    for c in CASES {
        let v = values(&mut rng, c);
        let (moe, tensors) = block(c, &v);
        let out = moe.forward(&tensors[0]).unwrap();
        let w = rng.vec(out.numel(), -1.0, 1.0);
        let wt = Tensor::from_slice(&w, out.shape(), &dev()).unwrap();
        out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let base = to64(&flat(c, &v));
        let loss = |vals: &[Vec<f64>]| -> f64 {
            reference(c, vals, &v.bias)
                .iter()
                .zip(&w)
                .map(|(a, &b)| a * b as f64)
                .sum()
        };
        let h = 1e-6;
        for (k, tensor) in tensors.iter().enumerate() {
            let grad = tensor
                .grad()
                .unwrap_or_else(|| panic!("{c:?}: tensor {k} has no gradient"));
            let analytic = grad.to_vec::<f32>().unwrap();
            let numeric: Vec<f64> = (0..base[k].len())
                .map(|j| {
                    let mut plus = base.clone();
                    plus[k][j] += h;
                    let mut minus = base.clone();
                    minus[k][j] -= h;
                    (loss(&plus) - loss(&minus)) / (2.0 * h)
                })
                .collect();
            assert_close(
                &format!("{c:?}: gradient of tensor {k}"),
                &analytic,
                &numeric,
                1e-3,
                1e-4,
            );
        }
    }
}

fn parse(json: &str) -> hierarchos::nn::Result<ModelConfig> {
    ModelConfig::from_json(json, Path::new("config.json"))
}

const BASE: &str = r#""vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2"#;

#[test]
fn moe_settings_parse_with_the_config_classes_defaults() {
    let mixtral = parse(&format!(r#"{{"model_type": "mixtral", {BASE}}}"#)).unwrap();
    let m = mixtral.moe.unwrap();
    assert_eq!((m.num_experts, m.top_k, m.expert_intermediate_size), (8, 2, 128));
    assert!(m.normalize_top_k && m.dense_layers.is_empty() && m.shared_expert.is_none());
    assert_eq!((m.scoring, m.routed_scaling_factor), (RouterScoring::Softmax, 1.0));
    assert_eq!((m.block_name, m.expert_names), ("block_sparse_moe", ["w1", "w3", "w2"]));

    // transformers writes either spelling of the expert count.
    let qwen3 = parse(&format!(
        r#"{{"model_type": "qwen3_moe", {BASE}, "num_local_experts": 6, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16}}"#
    ))
    .unwrap();
    let m = qwen3.moe.unwrap();
    assert_eq!((m.num_experts, m.top_k, m.expert_intermediate_size), (6, 2, 16));

    // Dense layers: listed in mlp_only_layers, or off the decoder_sparse_step grid.
    let qwen2 = parse(&format!(
        r#"{{"model_type": "qwen2_moe", {BASE}, "num_experts": 4, "num_experts_per_tok": 2,
            "mlp_only_layers": [0], "decoder_sparse_step": 2}}"#
    ))
    .unwrap();
    let m = qwen2.moe.unwrap();
    assert_eq!(m.dense_layers, vec![0, 2]);
    let shared = m.shared_expert.unwrap();
    assert_eq!(
        (shared.name, shared.intermediate_size, shared.gated),
        ("shared_expert", 5632, true)
    );
    assert!(!m.normalize_top_k);

    // DeepSeek-V3: grouped sigmoid routing, n_shared_experts as one MLP, dense first layers.
    let deepseek = parse(&format!(
        r#"{{"model_type": "deepseek_v3", {BASE}, "num_key_value_heads": 4, "n_routed_experts": 16,
            "moe_intermediate_size": 8, "n_shared_experts": 2, "first_k_dense_replace": 1}}"#
    ))
    .unwrap();
    let m = deepseek.moe.unwrap();
    assert_eq!((m.num_experts, m.top_k, m.expert_intermediate_size), (16, 8, 8));
    assert_eq!(
        m.scoring,
        RouterScoring::GroupedSigmoid {
            groups: 8,
            top_groups: 4
        }
    );
    assert!(m.normalize_top_k && m.routed_scaling_factor == 2.5 && m.dense_layers == vec![0]);
    let shared = m.shared_expert.unwrap();
    assert_eq!(
        (shared.name, shared.intermediate_size, shared.gated),
        ("shared_experts", 16, false)
    );

    let olmoe = parse(&format!(
        r#"{{"model_type": "olmoe", {BASE}, "num_experts": 4, "num_experts_per_tok": 2}}"#
    ))
    .unwrap();
    assert!(olmoe.qk_norm && olmoe.qk_norm_over_heads && olmoe.clip_after_qk_norm);
    assert!(
        parse(&format!(r#"{{"model_type": "llama", {BASE}}}"#))
            .unwrap()
            .moe
            .is_none()
    );
}

#[test]
fn bad_moe_settings_are_refused_with_the_field() {
    for (extra, field) in [
        (
            r#""num_local_experts": 2, "num_experts_per_tok": 3"#,
            "num_experts_per_tok",
        ),
        (r#""num_local_experts": 0"#, "num_local_experts"),
    ] {
        let err = parse(&format!(r#"{{"model_type": "mixtral", {BASE}, {extra}}}"#)).unwrap_err();
        assert!(err.to_string().contains(field), "{extra}: {err}");
    }
    let deepseek = r#""model_type": "deepseek_v3", "num_key_value_heads": 4, "n_routed_experts": 12"#;
    for (extra, field) in [
        // 12 experts in 8 groups, or in groups of 1 (the group score is the sum of the two best).
        (r#""n_group": 8"#, "n_group"),
        (r#""n_group": 12, "topk_group": 2, "num_experts_per_tok": 2"#, "n_group"),
        (r#""n_group": 4, "topk_group": 5"#, "topk_group"),
        (
            r#""n_group": 4, "topk_group": 1, "num_experts_per_tok": 4"#,
            "topk_group",
        ),
        (r#""n_group": 4, "routed_scaling_factor": 0"#, "routed_scaling_factor"),
    ] {
        let err = parse(&format!(r#"{{{BASE}, {deepseek}, {extra}}}"#)).unwrap_err();
        assert!(err.to_string().contains(field), "{extra}: {err}");
    }
    let err = parse(&format!(
        r#"{{"model_type": "qwen2_moe", {BASE}, "mlp_only_layers": ["x"]}}"#
    ))
    .unwrap_err();
    assert!(err.to_string().contains("mlp_only_layers"), "{err}");
    // Training settings load (training refuses them: nn_train.rs).
    let c = parse(&format!(
        r#"{{"model_type": "olmoe", {BASE}, "output_router_logits": true}}"#
    ))
    .unwrap();
    let refusal = c.moe.unwrap().training_unsupported.unwrap();
    assert!(refusal.contains("output_router_logits"), "{refusal}");
    // transformers adds the load-balancing loss times router_aux_loss_coef: with 0 training is the same.
    let c = parse(&format!(
        r#"{{"model_type": "olmoe", {BASE}, "output_router_logits": true, "router_aux_loss_coef": 0}}"#
    ))
    .unwrap();
    assert_eq!(c.moe.unwrap().training_unsupported, None);
    // Layers past the last one name no layer, as in transformers.
    let c = parse(&format!(
        r#"{{"model_type": "qwen2_moe", {BASE}, "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [1, 9]}}"#
    ))
    .unwrap();
    assert_eq!(c.moe.unwrap().dense_layers, vec![1]);
}
