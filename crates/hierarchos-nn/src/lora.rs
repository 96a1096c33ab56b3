//! LoRA adapters as Hugging Face PEFT defines and stores them. A frozen linear layer `y = x Wᵀ + b` gains a
//! trainable low-rank update, `y + scaling · (dropout(x) Aᵀ) Bᵀ` with `A` `[r, in]` and `B` `[out, r]`, so that
//! fine-tuning trains and stores a few matrices instead of the model. The files are PEFT's: `adapter_config.json`
//! and `adapter_model.safetensors` with tensors named `base_model.model.<module path>.lora_A.weight` and
//! `.lora_B.weight`, so adapters move between Hierarchos and `peft.PeftModel` in both directions.

#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hierarchos_core::{CmpOp, DType, Tensor, autocast_dtype, grad_enabled, no_grad};
use indexmap::IndexMap;
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::CausalLm;
use crate::decoder::HEAD_MODULE;
use crate::error::{Error, Result};
use crate::init::ParamRng;
use crate::linear::LinearWeight;
use crate::norm::Norm;
use crate::train::precision::is_power_of_two;
#[cfg(not(target_arch = "wasm32"))]
use crate::weights::{Weights, write_atomic};

/// The adapter's settings file in a PEFT adapter folder.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's tensors in a PEFT adapter folder.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// What PEFT puts before a module path in tensor names (the `PeftModel` wrapping a `LoraModel` wrapping the model).
const PEFT_PREFIX: &str = "base_model.model.";

/// Which linear layers get adapters (PEFT's `target_modules`, and `exclude_modules` for those to leave out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    /// Module names: a layer matches when its path is one of them or ends with `.` and one of them
    /// (`q_proj` matches `model.layers.3.self_attn.q_proj`).
    Names(Vec<String>),
    /// A regular expression the whole module path must match; `all-linear` is every linear layer but the
    /// output head.
    Pattern(String),
}

impl TargetModules {
    /// Parses the CLI's `--lora-targets`: `all-linear`, or a comma-separated list of module names.
    pub fn parse(list: &str) -> TargetModules {
        if list == ALL_LINEAR {
            TargetModules::Pattern(ALL_LINEAR.into())
        } else {
            TargetModules::Names(
                list.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
            )
        }
    }

    /// Whether this is PEFT's `all-linear`.
    fn is_all_linear(&self) -> bool {
        matches!(self, TargetModules::Pattern(p) if p.eq_ignore_ascii_case(ALL_LINEAR))
    }

    /// How `path` matches: exactly (a pattern, `all-linear`, or a name equal to the whole path), by a name
    /// suffix, or not at all. PEFT applies `layers_to_transform` to suffix matches only.
    fn matches(&self, path: &str) -> Result<Match> {
        Ok(match self {
            _ if self.is_all_linear() => Match::exact(path != "lm_head"),
            TargetModules::Pattern(p) => Match::exact(full_match(p)?.is_match(path)),
            TargetModules::Names(names) if names.iter().any(|n| n == path) => Match::Exact,
            TargetModules::Names(names) => {
                if names
                    .iter()
                    .any(|n| path.strip_suffix(n.as_str()).is_some_and(|rest| rest.ends_with('.')))
                {
                    Match::Suffix
                } else {
                    Match::None
                }
            }
        })
    }
}

/// How a module path matches [`TargetModules`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    None,
    Exact,
    Suffix,
}

impl Match {
    fn exact(yes: bool) -> Match {
        if yes { Match::Exact } else { Match::None }
    }
}

const ALL_LINEAR: &str = "all-linear";

fn full_match(pattern: &str) -> Result<Regex> {
    Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
        Error::Invalid(format!(
            "LoRA module pattern '{pattern}' is not a regular expression: {e}"
        ))
    })
}

/// PEFT's `adapter_config.json` for a LoRA adapter. Fields Hierarchos does not interpret are kept as they were
/// read and written back unchanged; those that would change the computation (DoRA, bias training, extra trained
/// modules, ...) are refused by [`LoraConfig::validate`] unless they hold their defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Always `LORA`.
    pub peft_type: String,
    /// `CAUSAL_LM` for the models Hierarchos trains.
    #[serde(default)]
    pub task_type: Option<String>,
    /// The model the adapter was trained on (a folder or a Hub id).
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    /// Rank of the update.
    pub r: usize,
    /// The update is scaled by `lora_alpha / r` (`lora_alpha / sqrt(r)` with rsLoRA).
    pub lora_alpha: f64,
    /// Dropout probability on the adapter's input while training.
    #[serde(default)]
    pub lora_dropout: f64,
    /// The adapted layers.
    pub target_modules: TargetModules,
    /// Layers matching these are not adapted even when targeted.
    #[serde(default)]
    pub exclude_modules: Option<TargetModules>,
    /// rsLoRA's scaling, `lora_alpha / sqrt(r)`.
    #[serde(default)]
    pub use_rslora: bool,
    /// Ranks of particular layers (keys are module names or patterns, as PEFT matches them, in the file's
    /// order: the first key that matches wins).
    #[serde(default)]
    pub rank_pattern: IndexMap<String, usize>,
    /// `lora_alpha` of particular layers (matched as `rank_pattern`).
    #[serde(default)]
    pub alpha_pattern: IndexMap<String, f64>,
    /// Adapt only the decoder layers with these indices (one index or a list).
    #[serde(default)]
    pub layers_to_transform: Option<LayerIndices>,
    /// Must be `none`: biases stay frozen.
    #[serde(default = "bias_none")]
    pub bias: String,
    /// PEFT's fields that Hierarchos does not interpret, as read.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// `layers_to_transform`: one layer index or several.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LayerIndices {
    /// One layer.
    One(usize),
    /// Several layers.
    Many(Vec<usize>),
}

fn bias_none() -> String {
    "none".into()
}

/// PEFT fields that Hierarchos may ignore whatever they hold: bookkeeping, and settings that only shape how an
/// adapter was initialized (a trained adapter's tensors say all there is). Any other field Hierarchos does not
/// interpret must hold its default (null, false, empty), or the adapter is refused: it would compute something
/// else here than in PEFT (DoRA, trained biases, extra trained modules, newer LoRA variants...).
/// `fan_in_fan_out` is one of the ignored: PEFT resets it to each layer's own layout (GPT-2's `Conv1D` weights
/// are stored `[in, out]`), and a merge here follows each layer's layout too.
const IGNORED_FIELDS: [&str; 15] = [
    "inference_mode",
    "init_lora_weights",
    "revision",
    "peft_version",
    "auto_mapping",
    "megatron_config",
    "megatron_core",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "qalora_group_size",
    "ensure_weight_tying",
    "layers_pattern",
    "fan_in_fan_out",
];

impl LoraConfig {
    /// A new adapter's settings, written the way PEFT writes them.
    pub fn new(r: usize, lora_alpha: f64, lora_dropout: f64, target_modules: TargetModules) -> LoraConfig {
        let mut other = serde_json::Map::new();
        for (key, value) in [
            ("fan_in_fan_out", Value::Bool(false)),
            ("inference_mode", Value::Bool(true)),
            ("init_lora_weights", Value::Bool(true)),
            ("layers_pattern", Value::Null),
            ("modules_to_save", Value::Null),
            ("revision", Value::Null),
            ("use_dora", Value::Bool(false)),
        ] {
            other.insert(key.into(), value);
        }
        LoraConfig {
            peft_type: "LORA".into(),
            task_type: Some("CAUSAL_LM".into()),
            base_model_name_or_path: None,
            r,
            lora_alpha,
            lora_dropout,
            target_modules,
            exclude_modules: None,
            use_rslora: false,
            rank_pattern: IndexMap::new(),
            alpha_pattern: IndexMap::new(),
            layers_to_transform: None,
            bias: bias_none(),
            other,
        }
    }

    /// Reads `dir/adapter_config.json` and checks that Hierarchos computes what it describes.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(dir: &Path) -> Result<LoraConfig> {
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let config: LoraConfig = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.clone(),
            message: format!("not a PEFT LoRA adapter config: {e}"),
        })?;
        config.validate().map_err(|message| Error::Config { path, message })?;
        Ok(config)
    }

    /// Why Hierarchos cannot run this adapter as PEFT would, if it cannot.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.peft_type != "LORA" {
            return Err(format!("peft_type '{}' is not LORA", self.peft_type));
        }
        if self.r == 0 || self.rank_pattern.values().any(|&r| r == 0) {
            return Err("a rank (r or rank_pattern) of 0".into());
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(format!("lora_dropout {} is not in [0, 1)", self.lora_dropout));
        }
        if !self.lora_alpha.is_finite() {
            return Err(format!("lora_alpha {} is not finite", self.lora_alpha));
        }
        if self.bias != "none" {
            return Err(format!(
                "bias '{}': only 'none' (frozen biases) is supported",
                self.bias
            ));
        }
        for (key, value) in &self.other {
            let default = match value {
                Value::Null | Value::Bool(false) => true,
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                _ => false,
            };
            if !default && !IGNORED_FIELDS.contains(&key.as_str()) {
                return Err(format!("{key} = {value} is not supported (Hierarchos runs plain LoRA)"));
            }
        }
        // PiSSA, OLoRA, CorDA and LoftQ take their starting update out of the base weights: PEFT does it again when
        // it loads such an adapter, so its tensors mean something else on the unchanged base here.
        if let Some(Value::String(init)) = self.other.get("init_lora_weights")
            && ["pissa", "olora", "corda", "loftq"].iter().any(|m| init.starts_with(m))
        {
            return Err(format!(
                "init_lora_weights '{init}' changes the base weights when PEFT loads the adapter, which is not \
                 supported (save it with PEFT's path_initial_model_for_weight_conversion, a plain LoRA of the \
                 original model)"
            ));
        }
        // Which decoder layer a module is in is the first number of its path (`model.layers.N.`, GPT-2's
        // `transformer.h.N.`): what PEFT's default pattern, or a pattern naming the list of layers, finds.
        match self.other.get("layers_pattern") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {}
            Some(other) => return Err(format!("layers_pattern {other} is not supported")),
        }
        if matches!(self.target_modules, TargetModules::Pattern(_)) && self.layers_to_transform.is_some() {
            return Err(
                "layers_to_transform cannot be combined with a target_modules pattern (PEFT refuses it)".into(),
            );
        }
        for pattern in self.rank_pattern.keys().chain(self.alpha_pattern.keys()) {
            pattern_regex(pattern).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Whether the targets are PEFT's `all-linear`.
    pub fn all_linear(&self) -> bool {
        self.target_modules.is_all_linear()
    }

    /// Whether the layer at module path `path` (in decoder layer `layer`, if any) gets an adapter.
    pub fn targets(&self, path: &str, layer: Option<usize>) -> Result<bool> {
        let found = self.target_modules.matches(path)?;
        if found == Match::None {
            return Ok(false);
        }
        if let Some(exclude) = &self.exclude_modules
            && exclude.matches(path)? != Match::None
        {
            return Ok(false);
        }
        // As PEFT: the layer list filters name-suffix matches only, and an empty list filters nothing.
        Ok(match (&self.layers_to_transform, layer) {
            _ if found == Match::Exact => true,
            (None, _) => true,
            (Some(LayerIndices::Many(v)), _) if v.is_empty() => true,
            (Some(_), None) => false,
            (Some(LayerIndices::One(i)), Some(l)) => *i == l,
            (Some(LayerIndices::Many(v)), Some(l)) => v.contains(&l),
        })
    }

    /// The rank and scaling of the adapter of the layer at `path` (`rank_pattern` and `alpha_pattern` applied).
    pub fn rank_and_scaling(&self, path: &str) -> Result<(usize, f64)> {
        let r = match pattern_value(&self.rank_pattern, path)? {
            Some(&r) => r,
            None => self.r,
        };
        let alpha = match pattern_value(&self.alpha_pattern, path)? {
            Some(&a) => a,
            None => self.lora_alpha,
        };
        let scaling = if self.use_rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        };
        Ok((r, scaling))
    }

    /// Writes the config as `dir/adapter_config.json` (through a temporary file).
    #[cfg(not(target_arch = "wasm32"))]
    fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(|e| Error::Invalid(format!("adapter config: {e}")))?;
        write_atomic(&dir.join(ADAPTER_CONFIG_FILE), json.as_bytes())
    }
}

/// PEFT's matching of `rank_pattern` / `alpha_pattern` keys: a key matches a module path that is the key or ends
/// with `.` and the key, the key read as a regular expression; the first matching key in the file's order wins.
fn pattern_value<'a, T>(patterns: &'a IndexMap<String, T>, path: &str) -> Result<Option<&'a T>> {
    for (key, value) in patterns {
        if pattern_regex(key)?.is_match(path) {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

fn pattern_regex(key: &str) -> Result<Regex> {
    Regex::new(&format!("^(?:.*\\.)?(?:{key})$")).map_err(|e| {
        Error::Invalid(format!(
            "LoRA rank/alpha pattern '{key}' is not a regular expression: {e}"
        ))
    })
}

/// Mixed into the run's seed for the dropout stream.
const DROPOUT_STREAM: u64 = 0x9e37_79b9_7f4a_7c15;

/// The counter-based stream the dropout masks of one model's adapters are drawn from. A training step sets where
/// it starts ([`CausalLm::seed_lora_dropout`]), so that a resumed run draws the same masks.
#[derive(Debug, Default)]
pub struct DropoutStream {
    seed: AtomicU64,
    next: AtomicU64,
}

impl DropoutStream {
    /// The offsets of `n` fresh draws.
    fn take(&self, n: usize) -> (u64, u64) {
        (
            self.seed.load(Ordering::Relaxed),
            self.next.fetch_add(n as u64, Ordering::Relaxed),
        )
    }
}

/// The adapter of one linear layer.
#[derive(Clone, Debug)]
pub struct Lora {
    /// `lora_A.weight`, `[r, in_features]`.
    pub a: Tensor,
    /// `lora_B.weight`, `[out_features, r]`.
    pub b: Tensor,
    /// Factor of the update: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA.
    pub scaling: f64,
    /// Dropout probability on the adapter's input while it trains.
    pub dropout: f64,
    /// Whether the update is currently added into the layer's weight (then the layer does not add it again).
    pub merged: bool,
    /// Whether the adapter is switched off ([`CausalLm::enable_adapters`]): the layer computes the base alone.
    pub disabled: bool,
    stream: Arc<DropoutStream>,
}

impl Lora {
    /// Whether the layer adds this adapter's update to its output: attached, on, and not merged.
    pub fn active(&self) -> bool {
        !self.merged && !self.disabled
    }

    /// `scaling · (dropout(x) Aᵀ) Bᵀ`, with PEFT's values: in its order of operations, or with the scaling
    /// moved onto `B` where that changes no bit (a power of two, outside f16). Dropout applies only while the
    /// adapter trains (gradients on, `A` trainable).
    pub fn forward(&self, x: &Tensor) -> hierarchos_core::Result<Tensor> {
        let x = if self.dropout > 0.0 && grad_enabled() && self.a.requires_grad() {
            let (seed, offset) = self.stream.take(x.numel());
            let keep = Tensor::rand(x.shape(), seed, offset, DType::F32, x.device())?
                .compare_scalar(self.dropout, CmpOp::Ge)?
                .to_dtype(x.dtype())?;
            x.mul(&keep.mul_scalar(1.0 / (1.0 - self.dropout))?)?
        } else {
            x.clone()
        };
        let a = self.a.to_dtype(x.dtype())?;
        let b = self.b.to_dtype(x.dtype())?;
        let xa = x.matmul(&a.t()?)?;
        if self.scaling == 1.0 {
            xa.matmul(&b.t()?)
        } else if scaling_moves_onto_b(self.scaling, x.dtype()) {
            xa.matmul(&b.mul_scalar(self.scaling)?.t()?)
        } else {
            xa.matmul(&b.t()?)?.mul_scalar(self.scaling)
        }
    }

    /// The update as a weight matrix, `scaling · B A` (`[out, in]`, f32).
    pub fn delta(&self) -> hierarchos_core::Result<Tensor> {
        no_grad(|| self.b.matmul(&self.a)?.mul_scalar(self.scaling))
    }
}

/// Whether scaling `B` (`[out, r]`) instead of the update (`[tokens, out]`) gives PEFT's values bit for bit, and
/// its gradients too: a power of two scales each rounded product and partial sum exactly, as long as the values
/// stay in the normal range. That holds in f32 and bf16 (normal down to 1e-38) and not where products round to
/// f16 (normal only down to 6e-5, which small updates reach). It saves an elementwise pass over the update in
/// the forward pass and another over its gradient in the backward pass of every adapted layer.
fn scaling_moves_onto_b(scaling: f64, dtype: DType) -> bool {
    // Kernels take the scaling as f32.
    let exact_in_f32 = (scaling as f32).is_normal();
    is_power_of_two(scaling) && exact_in_f32 && dtype != DType::F16 && autocast_dtype() != Some(DType::F16)
}

impl CausalLm {
    /// Attaches fresh adapters to the layers `config` targets, initialized as PEFT does (`A` Kaiming-uniform,
    /// i.e. uniform in ±1/√in, drawn from `seed`; `B` zero, so the model starts unchanged), and freezes every
    /// other parameter. Errors when no layer matches.
    pub fn add_lora(&mut self, config: &LoraConfig, seed: u64) -> Result<()> {
        config.validate().map_err(Error::Invalid)?;
        let device = self.device().clone();
        let mut rng = ParamRng::new(seed);
        let adapters = self.build_adapters(config, true, &mut |_, [out, inp], r| {
            let bound = 1.0 / (inp as f64).sqrt();
            Ok((
                rng.uniform(&[r, inp], -bound, bound, &device)?,
                Tensor::zeros(&[out, r], DType::F32, &device)?,
            ))
        })?;
        self.install(config, adapters);
        self.warn_of_expert_names();
        Ok(())
    }

    /// Warns, once an adapter is made here, when it adapts modules named as a mixture's expert projections: PEFT
    /// with transformers 5 reads those as LoRA on the fused expert parameters.
    fn warn_of_expert_names(&self) {
        let Some(moe) = &self.config().moe else { return };
        let expert_named = self
            .linears()
            .into_iter()
            .find(|(path, l)| l.lora.is_some() && moe.expert_names.iter().any(|n| path.ends_with(&format!(".{n}"))));
        if let Some((path, _)) = expert_named {
            tracing::warn!(
                "{path} and the other adapted modules named as the experts' projections are read by PEFT with \
                 transformers 5 as LoRA on the fused expert parameters: dense and shared-expert adapters of those \
                 names are dropped there, and only all three expert projections without rsLoRA load as trained \
                 (Hierarchos loads the adapter as it is)"
            );
        }
    }

    /// Attaches the PEFT adapter in folder `dir` (`adapter_config.json`, `adapter_model.safetensors`);
    /// `trainable` makes its tensors collect gradients. Every other parameter is frozen. Errors name the file and
    /// tensor at fault: a missing or misshapen tensor, or one no adapted layer claims; the model is then left as
    /// it was.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_adapter(&mut self, dir: &Path, trainable: bool) -> Result<LoraConfig> {
        let config = LoraConfig::read(dir)?;
        let path = dir.join(ADAPTER_WEIGHTS_FILE);
        if !path.is_file() && dir.join("adapter_model.bin").is_file() {
            return Err(Error::Weights {
                path: dir.join("adapter_model.bin"),
                message: "pickled adapters are not read (save the adapter with safe_serialization=True)".into(),
            });
        }
        let weights = Weights::open_file(&path)?;
        let device = self.device().clone();
        let mut claimed = Vec::new();
        let adapters = self.build_adapters(&config, trainable, &mut |module, [out, inp], r| {
            let name = |m: &str| format!("{PEFT_PREFIX}{module}.{m}.weight");
            let (a, b) = (name("lora_A"), name("lora_B"));
            let tensors = (
                weights.load(&a, &[r, inp], &device)?,
                weights.load(&b, &[out, r], &device)?,
            );
            claimed.extend([a, b]);
            Ok(tensors)
        })?;
        for extra in weights.names().into_iter().filter(|n| !claimed.contains(n)) {
            let message = if extra.contains(".lora_embedding_") {
                format!("tensor '{extra}': LoRA on embeddings is not supported")
            } else if let Some(module) = extra
                .strip_prefix(PEFT_PREFIX)
                .and_then(|n| n.strip_suffix(".base_layer.weight"))
                && self.holds_weight(module, &weights, &extra)?
            {
                // PEFT saves a targeted head's or embedding's own weights beside its adapter: the same as here.
                continue;
            } else {
                format!(
                    "tensor '{extra}' belongs to no layer adapter_config.json targets in this model (another base \
                     model?), or its copy of a base weight differs from this model's"
                )
            };
            return Err(Error::Weights { path, message });
        }
        self.install(&config, adapters);
        Ok(config)
    }

    /// Whether the linear layer at module path `module` holds exactly the weight that tensor `name` of `weights`
    /// holds (PEFT's copy of a base weight in an adapter).
    #[cfg(not(target_arch = "wasm32"))]
    fn holds_weight(&self, module: &str, weights: &Weights, name: &str) -> Result<bool> {
        let Some((_, layer)) = self.linears().into_iter().find(|(path, _)| path == module) else {
            return Ok(false);
        };
        let LinearWeight::Dense(own) = &layer.weight else {
            return Ok(false);
        };
        if weights.shape(name).as_deref() != Some(own.shape()) {
            return Ok(false);
        }
        let copy = weights.read_f32(name, own.shape())?;
        Ok(copy == own.to_dtype(DType::F32)?.to_vec::<f32>()?)
    }

    /// The adapters of every layer `config` targets, with tensors from `make(module path, [out, in], rank)`
    /// (trainable or not), by module path; nothing is attached yet, so an error leaves the model unchanged.
    fn build_adapters(&self, config: &LoraConfig, trainable: bool, make: AdapterSource) -> Result<Vec<(String, Lora)>> {
        if self.adapter.is_some() {
            return Err(Error::Invalid("the model already has an adapter".into()));
        }
        // PEFT adapts both (all-linear leaves them out), which Hierarchos cannot: refused by name rather than
        // left out.
        if !config.all_linear() {
            let embedding = self.config().names.embedding();
            if config.targets(&embedding, None)? {
                return Err(Error::Invalid(format!(
                    "{embedding}: LoRA on embeddings is not supported"
                )));
            }
            if self.config().tie_word_embeddings && self.lm_head.is_none() && config.targets(HEAD_MODULE, None)? {
                return Err(Error::Invalid(format!(
                    "{HEAD_MODULE}: the output head is the token embedding (tie_word_embeddings); LoRA on a tied \
                     head is not supported"
                )));
            }
        }
        let stream = Arc::new(DropoutStream::default());
        let mut adapters = Vec::new();
        for (path, layer) in self.linears() {
            if !config.targets(&path, layer_index(&path))? || (config.all_linear() && self.outside_all_linear(&path)) {
                continue;
            }
            if let LinearWeight::Quantized(_) = layer.weight {
                return Err(Error::Invalid(format!(
                    "{path}: adapters on quantized (GGUF) weights are not supported; load the model dequantized"
                )));
            }
            let (r, scaling) = config.rank_and_scaling(&path)?;
            let (a, b) = make(&path, layer.weight_shape(), r)?;
            let (a, b) = if trainable {
                (a.requires_grad_(), b.requires_grad_())
            } else {
                (a, b)
            };
            let lora = Lora {
                a,
                b,
                scaling,
                dropout: config.lora_dropout,
                merged: false,
                disabled: false,
                stream: stream.clone(),
            };
            adapters.push((path, lora));
        }
        if adapters.is_empty() {
            return Err(Error::Invalid(format!(
                "no linear layer of this model matches the LoRA targets {:?}",
                config.target_modules
            )));
        }
        Ok(adapters)
    }

    /// Attaches `adapters` (from [`CausalLm::build_adapters`]) and freezes the model's own parameters.
    fn install(&mut self, config: &LoraConfig, adapters: Vec<(String, Lora)>) {
        let mut adapters: std::collections::HashMap<String, Lora> = adapters.into_iter().collect();
        for (path, layer) in self.linears_mut() {
            layer.lora = adapters.remove(&path);
        }
        self.freeze_base();
        self.adapter = Some(Box::new(config.clone()));
    }

    /// The settings of the attached adapter, if any.
    pub fn adapter_config(&self) -> Option<&LoraConfig> {
        self.adapter.as_deref()
    }

    /// The adapter tensors with PEFT's names (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`),
    /// in module order.
    pub fn adapter_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = Vec::new();
        for (path, layer) in self.linears() {
            if let Some(lora) = &layer.lora {
                p.push((format!("{PEFT_PREFIX}{path}.lora_A.weight"), lora.a.clone()));
                p.push((format!("{PEFT_PREFIX}{path}.lora_B.weight"), lora.b.clone()));
            }
        }
        p
    }

    /// The tensors training updates: the adapter's when one is attached (PEFT's names), else every parameter
    /// (Hugging Face names).
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        if self.adapter.is_some() {
            self.adapter_parameters()
        } else {
            self.parameters()
        }
    }

    /// Records the model the adapter applies to (`base_model_name_or_path`: a folder or Hub id, and PEFT's
    /// `revision` for a Hub id), which resuming an adapter's training loads.
    pub fn set_adapter_base(&mut self, base: &str, revision: Option<&str>) {
        if let Some(config) = &mut self.adapter {
            config.base_model_name_or_path = Some(base.to_string());
            config.other.insert(
                "revision".into(),
                revision.map_or(Value::Null, |r| Value::String(r.into())),
            );
        }
    }

    /// Writes the adapter as a PEFT folder: `adapter_config.json` and `adapter_model.safetensors` (f32), each
    /// through a temporary file renamed into place.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn save_adapter(&self, dir: &Path) -> Result<()> {
        let Some(config) = self.adapter_config() else {
            return Err(Error::Invalid("the model has no adapter to save".into()));
        };
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Weights::save(&dir.join(ADAPTER_WEIGHTS_FILE), &self.adapter_parameters())?;
        let mut config = config.clone();
        if let TargetModules::Pattern(p) = &config.target_modules
            && p == ALL_LINEAR
        {
            let names = self
                .linears()
                .into_iter()
                .filter(|(_, l)| l.lora.is_some())
                .map(|(p, _)| p);
            config.target_modules = TargetModules::Names(names.collect());
        }
        config.write(dir)
    }

    /// Adds every adapter's update into its layer's weight (`W + scaling · B A`, computed in f32 and stored in the
    /// weight's dtype); the adapters stay attached, marked merged, for [`CausalLm::unmerge_adapters`]. The merged
    /// layers run as plain ones (Q/K/V and gate/up as one product again).
    pub fn merge_adapters(&mut self) -> Result<()> {
        self.shift_adapters(true)
    }

    /// Takes the merged updates back out of the weights (`W - scaling · B A`; equal to the weights before the
    /// merge up to rounding).
    pub fn unmerge_adapters(&mut self) -> Result<()> {
        self.shift_adapters(false)
    }

    fn shift_adapters(&mut self, merge: bool) -> Result<()> {
        for (path, layer) in self.linears_mut() {
            let Some(lora) = &mut layer.lora else {
                continue;
            };
            if lora.merged == merge {
                continue;
            }
            let LinearWeight::Dense(w) = &layer.weight else {
                return Err(Error::Invalid(format!("{path}: cannot merge into a quantized weight")));
            };
            // A `[in, out]` weight (GPT-2's Conv1D) takes the `[out, in]` update transposed.
            let delta = match layer.transposed {
                true => lora.delta()?.t()?,
                false => lora.delta()?,
            };
            let shifted = no_grad(|| {
                let w32 = w.to_dtype(DType::F32)?;
                let sum = if merge { w32.add(&delta)? } else { w32.sub(&delta)? };
                sum.to_dtype(w.dtype())
            })?;
            layer.weight = LinearWeight::Dense(shifted);
            lora.merged = merge;
        }
        self.restack()
    }

    /// Switches the (unmerged) adapters off or back on, so that the base model alone answers the same prompt
    /// without reloading anything (PEFT's `disable_adapter`).
    pub fn enable_adapters(&mut self, on: bool) {
        for (_, layer) in self.linears_mut() {
            if let Some(lora) = &mut layer.lora {
                lora.disabled = !on;
            }
        }
    }

    /// Drops the adapters (after a merge, to save the merged model as a plain one).
    pub fn remove_adapters(&mut self) {
        for (_, layer) in self.linears_mut() {
            layer.lora = None;
        }
        self.adapter = None;
    }

    /// Where the adapters' dropout masks of the coming training step are drawn from: `(seed, step)` fixes them,
    /// so that a resumed run repeats them.
    pub fn seed_lora_dropout(&self, seed: u64, step: usize) {
        for (_, layer) in self.linears() {
            if let Some(lora) = &layer.lora {
                // Not the stream `add_lora` drew `A` from with the same seed.
                lora.stream.seed.store(seed ^ DROPOUT_STREAM, Ordering::Relaxed);
                lora.stream.next.store((step as u64) << 40, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Holds the frozen model's matrices (linear weights, the embedding table) in `dtype` (f16 or bf16 halve
    /// them) while activations, norms, biases and adapters stay f32: the products of f32 activations with 16-bit
    /// weights accumulate in f32. Returns the bytes the matrices took before and after. Errors if a matrix is
    /// trainable (full fine-tuning keeps f32 weights) or `dtype` is not a float.
    pub fn store_frozen_in(&mut self, dtype: DType) -> Result<(usize, usize)> {
        if !dtype.is_float() {
            return Err(Error::Invalid(format!("cannot hold weights in {dtype}")));
        }
        let trainable = self.linears().into_iter().find_map(|(path, l)| match &l.weight {
            LinearWeight::Dense(w) if w.requires_grad() => Some(path),
            _ => None,
        });
        if let Some(path) = trainable.or(self
            .embed_tokens
            .weight
            .requires_grad()
            .then(|| "model.embed_tokens".into()))
        {
            return Err(Error::Invalid(format!(
                "{path} trains: only a frozen base (training an adapter) can be held in {dtype}"
            )));
        }
        let (mut before, mut after) = (0, 0);
        let mut cast = |t: &Tensor| -> Result<Tensor> {
            let c = t.to_dtype(dtype)?;
            before += t.numel() * t.dtype().size();
            after += c.numel() * dtype.size();
            Ok(c)
        };
        self.embed_tokens.weight = cast(&self.embed_tokens.weight)?;
        if let Some(positions) = &mut self.embed_positions {
            positions.weight = cast(&positions.weight)?;
        }
        for (_, layer) in self.linears_mut() {
            if let LinearWeight::Dense(w) = &layer.weight {
                layer.weight = LinearWeight::Dense(cast(w)?);
            }
        }
        // Stacked anew in the new dtype, so that the old f32 stacks are freed.
        self.restack()?;
        Ok((before, after))
    }

    /// The 16-bit dtype the frozen matrices are held in ([`CausalLm::store_frozen_in`]), if they are.
    pub fn frozen_dtype(&self) -> Option<DType> {
        Some(self.embed_tokens.weight.dtype()).filter(|&d| d != DType::F32)
    }

    /// Freezes the model's own parameters: they collect no gradients and get no optimizer state.
    pub fn freeze_base(&mut self) {
        self.embed_tokens.weight = self.embed_tokens.weight.detach();
        if let Some(positions) = &mut self.embed_positions {
            positions.weight = positions.weight.detach();
        }
        self.norm.detach();
        if let Some(norm) = &mut self.embed_norm {
            norm.detach();
        }
        for layer in &mut self.layers {
            layer.norms_mut().for_each(Norm::detach);
        }
        for (_, layer) in self.linears_mut() {
            if let LinearWeight::Dense(w) = &layer.weight {
                layer.weight = LinearWeight::Dense(w.detach());
            }
            layer.bias = layer.bias.as_ref().map(Tensor::detach);
        }
    }
}

/// Tensors `(A, B)` of the adapter of the layer at a module path, given its `[out, in]` shape and rank.
type AdapterSource<'a> = &'a mut dyn FnMut(&str, [usize; 2], usize) -> Result<(Tensor, Tensor)>;

/// The decoder layer index in a module path (`model.layers.N. ...`, `gpt_neox.layers.N. ...`): its first number.
fn layer_index(path: &str) -> Option<usize> {
    path.split('.').find_map(|part| part.parse().ok())
}

/// Whether `dir` holds a PEFT adapter (rather than a model).
#[cfg(not(target_arch = "wasm32"))]
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG_FILE).is_file()
}
