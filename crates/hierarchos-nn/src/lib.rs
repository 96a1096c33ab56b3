//! Layers, models and optimizers for Hierarchos: plain structs whose fields are their parameters, named like the
//! Hugging Face tensors they load from, with a `forward` and a `parameters` list for optimizers and saving.

#![warn(missing_docs)]

mod alibi;
pub mod attention;
mod chat_template;
mod config;
mod decoder;
mod embedding;
mod error;
mod feed_forward;
pub mod generate;
pub mod generation_config;
pub mod gguf;
#[cfg(not(target_arch = "wasm32"))]
pub mod hub;
mod init;
mod kv_cache;
mod latent_attention;
mod linear;
pub mod lora;
mod mlp;
mod model;
pub mod model_files;
mod moe;
mod norm;
pub mod optim;
pub mod registry;
pub mod rope;
pub mod sampling;
mod self_attention;
mod tokenizer;
pub mod train;
pub mod weights;

pub use alibi::{Alibi, alibi_slopes};
pub use chat_template::{ChatMessage, SpecialTokens, render_chat_template};
pub use config::{
    Activation, LatentAttentionConfig, ModelConfig, ModuleNames, MoeConfig, NormPlacement, QkvLayout, RopeConfig,
    RopeScaling, RouterScoring, SharedExpertConfig,
};
pub use decoder::{CausalLm, DecoderLayer, QuantSource};
pub use embedding::Embedding;
pub use error::{Error, Result};
pub use feed_forward::FeedForward;
#[cfg(not(target_arch = "wasm32"))]
pub use generate::generate;
pub use generate::{Generation, StopConditions, StopReason, generate_async};
pub use generation_config::GenerationConfig;
pub use init::ParamRng;
pub use kv_cache::KvCache;
pub use latent_attention::{LatentAttention, LatentQuery};
pub use linear::{Linear, LinearWeight};
pub use mlp::Mlp;
pub use model::Model;
pub use model_files::ModelFiles;
pub use moe::{Moe, SharedExpert};
pub use norm::{Norm, NormKind};
pub use registry::{ARCHITECTURES, Architecture, Family, Status, supported_model_types};
pub use sampling::{Sampler, SamplingConfig};
pub use self_attention::SelfAttention;
pub use tokenizer::{DecodeStream, Tokenizer};
pub use weights::Weights;
