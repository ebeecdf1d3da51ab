//! Rust binding of lbopt: fused optimizer steps (AdamW/Adam, SGD with momentum, Lion, AdEMAMix) with 4-bit, 8-bit,
//! FP8 or fp32 optimizer states, computed by the lbopt C library on buffers this crate owns (states) and borrows
//! (params, grads).
//!
//! Three levels, all over the same C calls:
//! - [`AdamW`]: AdamW/Adam over a fixed list of tensors, owning their states.
//! - [`Optim`]: any [`Optimizer`] from an [`OptimizerConfig`], owning its states.
//! - [`step`]: one generic step over [`Slot`]s whose states ([`StateBuffer`]s, 0 to [`MAX_STATES`] of them) the
//!   caller owns.
//!
//! ```no_run
//! use lbopt::{AdamW, StateKind};
//! let mut w = vec![0.5f32; 4096];
//! let g = vec![0.1f32; 4096];
//! let mut opt = AdamW::new(StateKind::Bit4, &[w.len()]).unwrap();
//! for step in 1..=10 {
//!     let lr = 1e-3 * (1.0 + (step as f64).cos()); // any schedule: the lr is a plain argument
//!     opt.step(&mut [&mut w[..]], &[&g[..]], lr).unwrap();
//! }
//! ```
//!
//! ```
//! use lbopt::{Optim, Optimizer, OptimizerConfig, StateKind};
//! let mut w = vec![0.5f32; 4096];
//! let g = vec![0.1f32; 4096];
//! let config = OptimizerConfig::new(Optimizer::Sgd).unwrap().state_kind(StateKind::Bit8).momentum(0.9).nesterov(true);
//! let mut opt = Optim::new(config, &[w.len()]).unwrap();
//! assert_eq!(opt.state_infos()[0].name, "momentum_buffer");
//! opt.step(&mut [&mut w[..]], &[&g[..]], 0.1).unwrap();
//! ```
pub mod ffi;

use std::ffi::CStr;
use std::fmt;
use std::os::raw::{c_char, c_int};
use std::str::FromStr;

/// The most states one slot carries (`LBOPT_MAX_STATES`).
pub const MAX_STATES: usize = ffi::LBOPT_MAX_STATES;

/// The status of errors this crate finds itself, before calling the library (not an `lbopt_status`).
pub const STATUS_BINDING: i32 = -1;

/// A library string that is static text (names); `None` for NULL.
fn static_str(p: *const c_char) -> Option<&'static str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the library documents these strings as static, NUL-terminated text.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// The kind of optimizer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    Bit4,
    Bit8,
    Fp8,
    Fp32,
}

impl StateKind {
    /// Every kind, in the order of `lbopt_state_kind`.
    pub const ALL: [StateKind; 4] = [StateKind::Bit4, StateKind::Bit8, StateKind::Fp8, StateKind::Fp32];

    fn id(self) -> c_int {
        match self {
            StateKind::Bit4 => ffi::LBOPT_STATE_4BIT,
            StateKind::Bit8 => ffi::LBOPT_STATE_8BIT,
            StateKind::Fp8 => ffi::LBOPT_STATE_FP8,
            StateKind::Fp32 => ffi::LBOPT_STATE_FP32,
        }
    }

    fn from_id(id: c_int) -> Option<StateKind> {
        StateKind::ALL.into_iter().find(|k| k.id() == id)
    }

    /// The library's name of the kind (`lbopt_state_kind_name`: "4bit", "8bit", "fp8", "fp32").
    pub fn name(self) -> &'static str {
        // SAFETY: a plain call; every StateKind is a kind the library names.
        static_str(unsafe { ffi::lbopt_state_kind_name(self.id()) }).unwrap_or("?")
    }

    /// The kind the library names `name`.
    pub fn from_name(name: &str) -> Option<StateKind> {
        StateKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Bytes of codes and float32 scales of one state of `numel` elements (`lbopt_state_layout`).
    pub fn layout(self, numel: usize) -> Result<Layout> {
        let mut raw = ffi::lbopt_layout::default();
        // SAFETY: raw is a valid out-pointer of the size passed.
        check(unsafe {
            ffi::lbopt_state_layout(self.id(), numel as i64, &mut raw, std::mem::size_of::<ffi::lbopt_layout>())
        })?;
        Ok(Layout { raw })
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StateKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StateKind::from_name(s).ok_or_else(|| {
            let names: Vec<_> = StateKind::ALL.iter().map(|k| k.name()).collect();
            binding_error(format!("{s:?} is no state kind (the library knows {})", names.join(", ")))
        })
    }
}

/// The sizes of one state of one tensor (`lbopt_layout`).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    raw: ffi::lbopt_layout,
}

impl Layout {
    /// Elements of the codes: uint8 for quantized kinds (4-bit: ceil(numel / 2)), float32 for fp32.
    pub fn codes_numel(&self) -> usize {
        self.raw.codes_numel as usize
    }
    pub fn codes_bytes(&self) -> usize {
        self.raw.codes_bytes as usize
    }
    /// Float32 scales, one per block (0 for fp32).
    pub fn scales_numel(&self) -> usize {
        self.raw.scales_numel as usize
    }
    /// Elements per scale block (0 for fp32).
    pub fn block_size(&self) -> usize {
        self.raw.block_size as usize
    }
    pub fn raw(&self) -> &ffi::lbopt_layout {
        &self.raw
    }
}

/// Which moment a state holds: it selects the codebook (signed for first moments, non-negative for second).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Moment {
    First,
    Second,
    /// Non-negative, on the signed 4-bit map's non-negative codes (AdEMAMix's nu); `Second` on the other kinds.
    SecondSigned,
}

impl Moment {
    const ALL: [Moment; 3] = [Moment::First, Moment::Second, Moment::SecondSigned];
    fn id(self) -> c_int {
        match self {
            Moment::First => ffi::LBOPT_MOMENT_FIRST,
            Moment::Second => ffi::LBOPT_MOMENT_SECOND,
            Moment::SecondSigned => ffi::LBOPT_MOMENT_SECOND_SIGNED,
        }
    }
}

/// A failed lbopt call: the status and the library's message naming the argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: i32,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lbopt status {}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(status: ffi::lbopt_status) -> Result<()> {
    if status == ffi::LBOPT_OK {
        return Ok(());
    }
    // SAFETY: both functions return valid, NUL-terminated static or thread-local strings.
    let message = unsafe {
        let text = CStr::from_ptr(ffi::lbopt_last_error()).to_string_lossy().into_owned();
        if text.is_empty() { CStr::from_ptr(ffi::lbopt_status_string(status)).to_string_lossy().into_owned() } else { text }
    };
    Err(Error { status, message })
}

fn binding_error(message: String) -> Error {
    Error { status: STATUS_BINDING, message }
}

/// The loaded library's version string; also checks its ABI major.
pub fn version() -> Result<String> {
    // SAFETY: plain calls without arguments; the string is static.
    unsafe {
        if ffi::lbopt_version() >> 16 != ffi::ABI_MAJOR {
            return Err(Error { status: -1, message: "liblbopt has another ABI major".into() });
        }
        Ok(CStr::from_ptr(ffi::lbopt_version_string()).to_string_lossy().into_owned())
    }
}

/// The library's one-line JSON build description (`lbopt_build_info`).
pub fn build_info() -> String {
    // SAFETY: a plain call; the thread-local string is copied before any other call.
    unsafe { CStr::from_ptr(ffi::lbopt_build_info()).to_string_lossy().into_owned() }
}

/// Element types of params and grads: `f32`, and `u16` holding bfloat16 bits.
pub trait Element: Copy {
    const DTYPE: ffi::DLDataType;
}
impl Element for f32 {
    const DTYPE: ffi::DLDataType = ffi::DLDataType { code: ffi::KDL_FLOAT, bits: 32, lanes: 1 };
}
impl Element for u16 {
    const DTYPE: ffi::DLDataType = ffi::DLDataType { code: ffi::KDL_BFLOAT, bits: 16, lanes: 1 };
}

/// A 1-d CPU DLTensor over a buffer; `shape` must outlive its use.
fn tensor(data: *mut u8, shape: *mut i64, dtype: ffi::DLDataType) -> ffi::DLTensor {
    ffi::DLTensor {
        data: data.cast(),
        device: ffi::DLDevice { device_type: ffi::KDL_CPU, device_id: 0 },
        ndim: 1,
        dtype,
        shape,
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

const NO_STATE: ffi::lbopt_state = ffi::lbopt_state { codes: std::ptr::null(), scales: std::ptr::null() };

// ------------------------------------------------------------------------------------------------------------------
// Optimizers and their configs.

/// The optimizers of the generic step (`lbopt_optimizer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Optimizer {
    /// AdamW, or Adam with [`OptimizerConfig::coupled_decay`], optionally AMSGrad.
    AdamW,
    /// torch.optim.SGD: momentum, dampening, Nesterov, coupled weight decay.
    Sgd,
    /// Lion (bitsandbytes' update), decoupled weight decay.
    Lion,
    /// AdEMAMix (bitsandbytes' update).
    AdEMAMix,
    /// Muon's momentum: the step writes the update direction into the param buffer, for the caller to
    /// orthogonalize and apply.
    Muon,
}

impl Optimizer {
    /// Every optimizer, in the order of `lbopt_optimizer`.
    pub const ALL: [Optimizer; 5] =
        [Optimizer::AdamW, Optimizer::Sgd, Optimizer::Lion, Optimizer::AdEMAMix, Optimizer::Muon];

    fn id(self) -> c_int {
        match self {
            Optimizer::AdamW => ffi::LBOPT_OPTIMIZER_ADAMW,
            Optimizer::Sgd => ffi::LBOPT_OPTIMIZER_SGD,
            Optimizer::Lion => ffi::LBOPT_OPTIMIZER_LION,
            Optimizer::AdEMAMix => ffi::LBOPT_OPTIMIZER_ADEMAMIX,
            Optimizer::Muon => ffi::LBOPT_OPTIMIZER_MUON,
        }
    }

    fn from_id(id: c_int) -> Option<Optimizer> {
        Optimizer::ALL.into_iter().find(|o| o.id() == id)
    }

    /// The library's name (`lbopt_optimizer_name`: "adamw", "sgd", "lion", "ademamix", "muon").
    pub fn name(self) -> &'static str {
        // SAFETY: a plain call; every Optimizer is one the library names.
        static_str(unsafe { ffi::lbopt_optimizer_name(self.id()) }).unwrap_or("?")
    }

    /// The hyper-parameters and flags this optimizer reads beyond the common flags, as the library lists them
    /// (`lbopt_optimizer_fields`), in its registry operators' attribute order.
    pub fn fields(self) -> Result<Vec<FieldInfo>> {
        let mut fields: *const ffi::lbopt_field_info = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: valid out-pointers; the library points fields at n entries of static storage.
        check(unsafe { ffi::lbopt_optimizer_fields(self.id(), &mut fields, &mut n) })?;
        // SAFETY: n entries at fields, never freed.
        let infos = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(fields, n) } };
        Ok(infos
            .iter()
            .map(|f| FieldInfo {
                name: static_str(f.name).unwrap_or("?"),
                flag: (f.type_ == ffi::LBOPT_ATTR_BOOL).then_some(f.flag),
                default: f.default_value,
                min: f.min,
                max: f.max,
                max_inclusive: f.max_inclusive != 0,
            })
            .collect())
    }

    /// The optimizer the library names `name`.
    pub fn from_name(name: &str) -> Option<Optimizer> {
        Optimizer::ALL.into_iter().find(|o| o.name() == name)
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Optimizer {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Optimizer::from_name(s).ok_or_else(|| {
            let names: Vec<_> = Optimizer::ALL.iter().map(|o| o.name()).collect();
            binding_error(format!("{s:?} is no optimizer (the library knows {})", names.join(", ")))
        })
    }
}

/// One hyper-parameter or flag of an optimizer, as the library describes it (`lbopt_field_info`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FieldInfo {
    /// The `lbopt_optimizer_config` field ("beta1", "momentum", ...) or the flag's name ("amsgrad", "nesterov").
    pub name: &'static str,
    /// For a flag, its `LBOPT_FLAG_` bit; None for a field.
    pub flag: Option<u32>,
    /// A field's default (`lbopt_optimizer_config_init`).
    pub default: f64,
    /// A field's accepted values: `min <= x` and `x < max` (`x <= max` if `max_inclusive`); an infinite max means
    /// any finite value.
    pub min: f64,
    pub max: f64,
    pub max_inclusive: bool,
}

/// One state of an optimizer, as the library describes it (`lbopt_state_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateInfo {
    /// Its name, as in a torch state dict ("exp_avg", "momentum_buffer", "m1", ...).
    pub name: &'static str,
    /// The codebook it is stored on: the moment to pass to [`StateBuffer::quantize`] / [`StateBuffer::dequantize`].
    pub moment: Moment,
}

/// The hyper-parameters of one optimizer (`lbopt_optimizer_config`), starting from the library's defaults for it.
/// The setters take and return the config (builder style); the library checks the values
/// ([`OptimizerConfig::validate`], [`OptimizerConfig::states`], [`Optim::new`] and every step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimizerConfig {
    raw: ffi::lbopt_optimizer_config,
}

macro_rules! f64_setters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(mut self, value: f64) -> Self {
            self.raw.$name = value;
            self
        }
    )*};
}

impl OptimizerConfig {
    /// The library's defaults for `optimizer` (`lbopt_optimizer_config_init`): 4-bit states, and the optimizer's own
    /// betas, eps, weight decay, momentum, alpha...
    pub fn new(optimizer: Optimizer) -> Result<Self> {
        let mut raw = ffi::lbopt_optimizer_config::default();
        // SAFETY: raw is a valid out-pointer of the size passed.
        check(unsafe {
            ffi::lbopt_optimizer_config_init(&mut raw, std::mem::size_of::<ffi::lbopt_optimizer_config>(), optimizer.id())
        })?;
        Ok(OptimizerConfig { raw })
    }

    /// The C struct, to read any field or to pass to the ffi calls.
    pub fn raw(&self) -> &ffi::lbopt_optimizer_config {
        &self.raw
    }

    pub fn optimizer(&self) -> Optimizer {
        Optimizer::from_id(self.raw.optimizer).expect("config_init sets a known optimizer")
    }

    /// The state kind; `None` only if the raw field was set to a value that is no kind.
    pub fn kind(&self) -> Option<StateKind> {
        StateKind::from_id(self.raw.state_kind)
    }

    pub fn state_kind(mut self, kind: StateKind) -> Self {
        self.raw.state_kind = kind.id();
        self
    }

    /// All `LBOPT_FLAG_*` bits at once (see the boolean setters below).
    pub fn flags(mut self, flags: u32) -> Self {
        self.raw.flags = flags;
        self
    }

    fn flag(mut self, bit: u32, on: bool) -> Self {
        if on {
            self.raw.flags |= bit;
        } else {
            self.raw.flags &= !bit;
        }
        self
    }

    /// AdamW: Adam with L2 decay coupled into the gradient (`LBOPT_FLAG_ADAM_COUPLED_DECAY`).
    pub fn coupled_decay(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_ADAM_COUPLED_DECAY, on)
    }
    /// AdamW: AMSGrad, with a third state max_exp_avg_sq (`LBOPT_FLAG_AMSGRAD`).
    pub fn amsgrad(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_AMSGRAD, on)
    }
    /// SGD: Nesterov momentum; needs momentum > 0 and dampening = 0 (`LBOPT_FLAG_NESTEROV`).
    pub fn nesterov(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_NESTEROV, on)
    }
    /// AdEMAMix: keep nu on the unsigned map (4-bit: the linear one, as lbopt 0.3 did;
    /// `LBOPT_FLAG_NU_LINEAR_MAP`).
    pub fn nu_linear_map(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_NU_LINEAR_MAP, on)
    }
    /// Ascend: use -grad (`LBOPT_FLAG_MAXIMIZE`).
    pub fn maximize(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_MAXIMIZE, on)
    }
    /// Round bfloat16 params stochastically, keyed by [`OptimizerConfig::seed`] (`LBOPT_FLAG_BF16_STOCHASTIC_ROUND`).
    pub fn bf16_stochastic_round(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_BF16_STOCHASTIC_ROUND, on)
    }
    /// Round the codes of quantized first-moment states (exp_avg, momentum, m1, m2) stochastically, unbiased, keyed
    /// by [`OptimizerConfig::seed`] (`LBOPT_FLAG_STATE_STOCHASTIC_ROUND`), or to nearest
    /// (`LBOPT_FLAG_STATE_NEAREST_ROUND`). Unset: the default, stochastic for SGD, Lion and AdEMAMix on 4-bit and
    /// FP8 states.
    pub fn state_stochastic_round(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_STATE_STOCHASTIC_ROUND, on).flag(ffi::LBOPT_FLAG_STATE_NEAREST_ROUND, !on)
    }
    /// Leave a tensor whose grad has NaN/Inf untouched (`LBOPT_FLAG_SKIP_NONFINITE`); [`Optim`] then does not count
    /// the step for it.
    pub fn skip_nonfinite(self, on: bool) -> Self {
        self.flag(ffi::LBOPT_FLAG_SKIP_NONFINITE, on)
    }

    /// The stochastic rounding key.
    pub fn seed(mut self, seed: u64) -> Self {
        self.raw.seed = seed;
        self
    }

    f64_setters!(
        /// [0, 1): AdamW's and AdEMAMix's first-moment EMA, Lion's interpolation.
        beta1,
        /// [0, 1): the second-moment EMA of AdamW and AdEMAMix, the momentum's EMA of Lion.
        beta2,
        /// [0, 1), AdEMAMix: the slow EMA.
        beta3,
        /// Finite, >= 0: AdamW and AdEMAMix.
        eps,
        /// Finite, >= 0: decoupled for AdamW, Lion, AdEMAMix; coupled (L2) for SGD and Adam.
        weight_decay,
        /// Finite, >= 0, SGD: 0 is plain SGD, without a state.
        momentum,
        /// [0, 1], SGD.
        dampening,
        /// Finite, >= 0, AdEMAMix: the slow EMA's weight.
        alpha,
        /// Finite, >= 0, AdEMAMix: steps of alpha's linear warm-up (0: none).
        t_alpha,
        /// Finite, >= 0, AdEMAMix: steps of beta3's warm-up (0: none).
        t_beta3,
    );

    /// AdamW's and Lion's (beta1, beta2) at once.
    pub fn betas(self, beta1: f64, beta2: f64) -> Self {
        self.beta1(beta1).beta2(beta2)
    }

    /// The library's checks of this config and `lr` (`lbopt_optimizer_config_validate`).
    pub fn validate(&self, lr: f64) -> Result<()> {
        // SAFETY: a valid config pointer.
        check(unsafe { ffi::lbopt_optimizer_config_validate(&self.raw, lr) })
    }

    /// The states a step of this config reads and writes, in slot order (`lbopt_optimizer_states`); validates the
    /// config as the step does.
    pub fn states(&self) -> Result<Vec<StateInfo>> {
        let mut infos = [ffi::lbopt_state_info::default(); MAX_STATES];
        let mut n = 0usize;
        // SAFETY: infos has LBOPT_MAX_STATES entries; n is a valid out-pointer.
        check(unsafe { ffi::lbopt_optimizer_states(&self.raw, infos.as_mut_ptr(), &mut n) })?;
        infos[..n.min(MAX_STATES)]
            .iter()
            .map(|i| {
                let Some(moment) = Moment::ALL.into_iter().find(|m| m.id() == i.moment) else {
                    return Err(binding_error(format!("lbopt_optimizer_states gave moment {}", i.moment)));
                };
                Ok(StateInfo { name: static_str(i.name).unwrap_or("?"), moment })
            })
            .collect()
    }
}

// ------------------------------------------------------------------------------------------------------------------
// State buffers and the generic step.

/// One optimizer state of one tensor: codes (kept in u32 words, so float32 codes are aligned) and float32 scales,
/// sized by the library's layout for its kind and element count. New buffers hold zeros: the state of a tensor never
/// stepped.
#[derive(Clone, Debug)]
pub struct StateBuffer {
    kind: StateKind,
    numel: usize,
    codes: Vec<u32>,
    scales: Vec<f32>,
    layout: Layout,
}

/// Raw pointers to a StateBuffer's codes and scales with their sizes: writable when made by
/// [`StateBuffer::raw_mut`], read-only when made by [`StateBuffer::raw`].
#[derive(Clone, Copy)]
struct RawState {
    kind: StateKind,
    numel: usize,
    codes: *mut u8,
    scales: *mut u8,
    codes_numel: i64,
    scales_numel: i64,
    codes_dtype: ffi::DLDataType,
}

/// DLTensors over one RawState, pointing at their own shapes: boxed, so that they do not move once pointed.
struct StateTensors {
    shapes: [i64; 2],
    codes: ffi::DLTensor,
    scales: ffi::DLTensor,
}

impl RawState {
    fn tensors(&self) -> Box<StateTensors> {
        let mut t = Box::new(StateTensors {
            shapes: [self.codes_numel, self.scales_numel],
            codes: tensor(self.codes, std::ptr::null_mut(), self.codes_dtype),
            scales: tensor(self.scales, std::ptr::null_mut(), f32::DTYPE),
        });
        t.codes.shape = &mut t.shapes[0];
        t.scales.shape = &mut t.shapes[1];
        t
    }
}

impl StateTensors {
    fn state(&self, kind: StateKind) -> ffi::lbopt_state {
        ffi::lbopt_state {
            codes: &self.codes,
            scales: if kind == StateKind::Fp32 { std::ptr::null() } else { &self.scales },
        }
    }
}

impl StateBuffer {
    /// A zero state (`lbopt_state_init`) of `kind` for a tensor of `numel` elements.
    pub fn new(kind: StateKind, numel: usize) -> Result<Self> {
        let layout = kind.layout(numel)?;
        let mut buf = StateBuffer {
            kind,
            numel,
            codes: vec![0; layout.codes_bytes().div_ceil(4)],
            scales: vec![0.0; layout.scales_numel()],
            layout,
        };
        let t = buf.raw_mut().tensors();
        // SAFETY: the tensors describe buf's own buffers, of the library's sizes; buf is exclusively borrowed.
        check(unsafe { ffi::lbopt_state_init(kind.id(), numel as i64, t.state(kind), std::ptr::null_mut()) })?;
        Ok(buf)
    }

    /// States for every state of `config` (its kind, [`OptimizerConfig::states`]) of a tensor of `numel` elements.
    pub fn for_config(config: &OptimizerConfig, numel: usize) -> Result<Vec<StateBuffer>> {
        let kind = config.kind().ok_or_else(|| binding_error("config.state_kind is no state kind".into()))?;
        config.states()?.iter().map(|_| StateBuffer::new(kind, numel)).collect()
    }

    pub fn kind(&self) -> StateKind {
        self.kind
    }
    /// Elements of the tensor this state belongs to.
    pub fn numel(&self) -> usize {
        self.numel
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The codes, `layout().codes_bytes()` bytes (float32 values in native byte order for fp32).
    pub fn codes(&self) -> &[u8] {
        // SAFETY: u32 words reinterpreted as their bytes; codes_bytes <= 4 * words.
        unsafe { std::slice::from_raw_parts(self.codes.as_ptr().cast(), self.layout.codes_bytes()) }
    }
    pub fn codes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as codes(); every byte pattern is a valid u32.
        unsafe { std::slice::from_raw_parts_mut(self.codes.as_mut_ptr().cast(), self.layout.codes_bytes()) }
    }
    /// The float32 block scales (empty for fp32).
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    pub fn scales_mut(&mut self) -> &mut [f32] {
        &mut self.scales
    }

    /// Pointers for calls that write the state.
    fn raw_mut(&mut self) -> RawState {
        RawState {
            kind: self.kind,
            numel: self.numel,
            codes: self.codes.as_mut_ptr().cast(),
            scales: self.scales.as_mut_ptr().cast(),
            codes_numel: self.layout.raw.codes_numel,
            scales_numel: self.layout.raw.scales_numel,
            codes_dtype: self.layout.raw.codes_dtype,
        }
    }

    /// Pointers for calls that only read the state (`*mut` as DLTensor has it; nothing writes through them).
    fn raw(&self) -> RawState {
        RawState {
            kind: self.kind,
            numel: self.numel,
            codes: self.codes.as_ptr() as *mut u8,
            scales: self.scales.as_ptr() as *mut u8,
            codes_numel: self.layout.raw.codes_numel,
            scales_numel: self.layout.raw.scales_numel,
            codes_dtype: self.layout.raw.codes_dtype,
        }
    }

    /// The decoded values (`lbopt_dequantize`), for inspection or checkpoints.
    pub fn dequantize(&self, moment: Moment) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.numel];
        let mut n = self.numel as i64;
        let dst = tensor(out.as_mut_ptr().cast(), &mut n, f32::DTYPE);
        let t = self.raw().tensors();
        // SAFETY: the tensors describe this buffer's memory, which the library only reads; dst is `out`.
        check(unsafe { ffi::lbopt_dequantize(self.kind.id(), moment.id(), t.state(self.kind), &dst, std::ptr::null_mut()) })?;
        Ok(out)
    }

    /// Encode `values` (numel of them, finite; non-negative for [`Moment::Second`]) into this state
    /// (`lbopt_quantize`), e.g. from a checkpoint or a torch state; refused values leave it untouched.
    pub fn quantize(&mut self, moment: Moment, values: &[f32]) -> Result<()> {
        let mut n = values.len() as i64;
        let src = tensor(values.as_ptr() as *mut u8, &mut n, f32::DTYPE);
        let t = self.raw_mut().tensors();
        // SAFETY: src is read only; the tensors describe this (exclusively borrowed) buffer's memory.
        check(unsafe { ffi::lbopt_quantize(self.kind.id(), moment.id(), &src, t.state(self.kind), std::ptr::null_mut()) })
    }
}

/// One parameter tensor of a generic [`step`]: its param (written), grad (read), states (read and written: the
/// optimizer's, in the order of [`OptimizerConfig::states`], 0 to [`MAX_STATES`] of them) and the count this step
/// makes (1 on the first).
pub struct Slot<'a, P: Element, G: Element> {
    pub param: &'a mut [P],
    pub grad: &'a [G],
    pub states: &'a mut [StateBuffer],
    pub step: i64,
}

/// One slot as raw pointers: writable ones derived from exclusive borrows for a step, read-only ones for a
/// validation.
struct RawSlot {
    param: *mut u8,
    param_len: usize,
    param_dtype: ffi::DLDataType,
    grad: *mut u8,
    grad_len: usize,
    grad_dtype: ffi::DLDataType,
    states: Vec<RawState>,
    step: i64,
}

impl<P: Element, G: Element> Slot<'_, P, G> {
    fn raw_mut(&mut self) -> RawSlot {
        RawSlot {
            param: self.param.as_mut_ptr().cast(),
            param_len: self.param.len(),
            param_dtype: P::DTYPE,
            grad: self.grad.as_ptr() as *mut u8,
            grad_len: self.grad.len(),
            grad_dtype: G::DTYPE,
            states: self.states.iter_mut().map(StateBuffer::raw_mut).collect(),
            step: self.step,
        }
    }

    fn raw(&self) -> RawSlot {
        RawSlot {
            param: self.param.as_ptr() as *mut u8,
            param_len: self.param.len(),
            param_dtype: P::DTYPE,
            grad: self.grad.as_ptr() as *mut u8,
            grad_len: self.grad.len(),
            grad_dtype: G::DTYPE,
            states: self.states.iter().map(StateBuffer::raw).collect(),
            step: self.step,
        }
    }
}

/// The C arguments of one call: DLTensors over the slots' buffers and the lbopt_slots pointing at them. The
/// tensors and their shapes are boxed, so the pointers stay valid while this lives, wherever it moves.
#[allow(clippy::vec_box)] // the boxes keep the pointed-at tensors in place while the vectors grow
struct CallArgs {
    _params: Vec<Box<[(i64, ffi::DLTensor); 2]>>,
    _states: Vec<Box<StateTensors>>,
    slots: Vec<ffi::lbopt_slot>,
}

/// Checks what the library cannot know (a state made for another kind or size: the layouts of 8-bit and FP8
/// agree) and builds the C arguments.
fn call_args(config: &OptimizerConfig, raw: &[RawSlot]) -> Result<CallArgs> {
    let kind = config.kind();
    let mut args = CallArgs { _params: Vec::new(), _states: Vec::new(), slots: Vec::with_capacity(raw.len()) };
    for (i, s) in raw.iter().enumerate() {
        if s.states.len() > MAX_STATES {
            return Err(binding_error(format!("slots[{i}].states: {} states, at most {MAX_STATES}", s.states.len())));
        }
        let mut pg = Box::new([
            (s.param_len as i64, tensor(s.param, std::ptr::null_mut(), s.param_dtype)),
            (s.grad_len as i64, tensor(s.grad, std::ptr::null_mut(), s.grad_dtype)),
        ]);
        for (n, t) in pg.iter_mut() {
            t.shape = n;
        }
        let mut c = ffi::lbopt_slot {
            struct_size: std::mem::size_of::<ffi::lbopt_slot>() as u32,
            param: &pg[0].1,
            grad: &pg[1].1,
            states: [NO_STATE; MAX_STATES],
            step: s.step,
        };
        args._params.push(pg);
        for (k, b) in s.states.iter().enumerate() {
            if Some(b.kind) != kind {
                return Err(binding_error(format!(
                    "slots[{i}].states[{k}]: a {} state, but config.state_kind is {}",
                    b.kind,
                    kind.map_or("no kind", StateKind::name)
                )));
            }
            if b.numel != s.param_len {
                return Err(binding_error(format!(
                    "slots[{i}].states[{k}]: a state of {} elements for a param of {}",
                    b.numel, s.param_len
                )));
            }
            let t = b.tensors();
            c.states[k] = t.state(b.kind);
            args._states.push(t);
        }
        args.slots.push(c);
    }
    Ok(args)
}

fn run_step(config: &OptimizerConfig, lr: f64, raw: &[RawSlot], skipped: Option<&mut [u8]>) -> Result<()> {
    let args = call_args(config, raw)?;
    let mut n_skipped = raw.len() as i64;
    let u8_dtype = ffi::DLDataType { code: ffi::KDL_UINT, bits: 8, lanes: 1 };
    let skipped_t = skipped.map(|s| tensor(s.as_mut_ptr(), &mut n_skipped, u8_dtype));
    let options = ffi::lbopt_step_options {
        struct_size: std::mem::size_of::<ffi::lbopt_step_options>() as u32,
        grad_scale: std::ptr::null(),
        found_inf: std::ptr::null(),
        skipped: skipped_t.as_ref().map_or(std::ptr::null(), |t| t as *const _),
        stream: std::ptr::null_mut(),
        flags: 0,
    };
    // SAFETY: every pointer refers to a live buffer of the size its DLTensor states (the library validates the
    // sizes, dtypes and overlaps again); params, states and `skipped` are exclusively borrowed by the caller for
    // the call, grads are only read.
    check(unsafe { ffi::lbopt_step(&config.raw, lr, args.slots.as_ptr(), args.slots.len(), &options) })
}

fn run_validate(config: &OptimizerConfig, lr: f64, raw: &[RawSlot]) -> Result<()> {
    let args = call_args(config, raw)?;
    // SAFETY: as run_step; the library reads no buffer (no options) and writes none.
    check(unsafe { ffi::lbopt_step_validate(&config.raw, lr, args.slots.as_ptr(), args.slots.len(), std::ptr::null()) })
}

/// One fused in-place step of `config`'s optimizer over every slot, in one library call (`lbopt_step`), with
/// learning rate `lr` (may differ on every call). The whole call is validated first: on an error nothing is written.
pub fn step<P: Element, G: Element>(config: &OptimizerConfig, lr: f64, slots: &mut [Slot<'_, P, G>]) -> Result<()> {
    let raw: Vec<RawSlot> = slots.iter_mut().map(Slot::raw_mut).collect();
    run_step(config, lr, &raw, None)
}

/// [`step`] that also reports, in `skipped` (one byte per slot), 1 where a slot was left untouched (a non-finite
/// grad with [`OptimizerConfig::skip_nonfinite`]), else 0.
pub fn step_skipped<P: Element, G: Element>(
    config: &OptimizerConfig,
    lr: f64,
    slots: &mut [Slot<'_, P, G>],
    skipped: &mut [u8],
) -> Result<()> {
    if skipped.len() != slots.len() {
        return Err(binding_error(format!("skipped: {} entries for {} slots", skipped.len(), slots.len())));
    }
    let raw: Vec<RawSlot> = slots.iter_mut().map(Slot::raw_mut).collect();
    run_step(config, lr, &raw, Some(skipped))
}

/// Every check [`step`] makes on the same arguments, and nothing else (`lbopt_step_validate`): nothing is written.
/// A caller that splits one logical step into several calls validates them all first.
pub fn step_validate<P: Element, G: Element>(config: &OptimizerConfig, lr: f64, slots: &[Slot<'_, P, G>]) -> Result<()> {
    let raw: Vec<RawSlot> = slots.iter().map(Slot::raw).collect();
    run_validate(config, lr, &raw)
}

// ------------------------------------------------------------------------------------------------------------------
// Owning optimizers.

/// Any optimizer over a fixed list of tensors, owning their states.
#[derive(Clone, Debug)]
pub struct Optim {
    config: OptimizerConfig,
    infos: Vec<StateInfo>,
    sizes: Vec<usize>,
    states: Vec<Vec<StateBuffer>>,
    tensor_steps: Vec<i64>,
    steps: i64,
    skipped: Vec<u8>,
}

impl Optim {
    /// Zero states of `config` for tensors of the given element counts; the config is validated here.
    pub fn new(config: OptimizerConfig, sizes: &[usize]) -> Result<Self> {
        let infos = config.states()?;
        let states = sizes.iter().map(|&n| StateBuffer::for_config(&config, n)).collect::<Result<Vec<_>>>()?;
        Ok(Optim {
            config,
            infos,
            sizes: sizes.to_vec(),
            states,
            tensor_steps: vec![0; sizes.len()],
            steps: 0,
            skipped: vec![0; sizes.len()],
        })
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// New hyper-parameters for the next steps. They must keep the optimizer, the state kind and the states (e.g.
    /// SGD's momentum cannot become 0 or stop being 0); they are validated here.
    pub fn set_config(&mut self, config: OptimizerConfig) -> Result<()> {
        let infos = config.states()?;
        if config.optimizer() != self.config.optimizer() || config.kind() != self.config.kind() || infos != self.infos {
            return Err(binding_error(format!(
                "set_config: {} with {} states {:?} cannot follow {} with {} states {:?}",
                config.optimizer(),
                config.kind().map_or("?", StateKind::name),
                infos.iter().map(|i| i.name).collect::<Vec<_>>(),
                self.config.optimizer(),
                self.config.kind().map_or("?", StateKind::name),
                self.infos.iter().map(|i| i.name).collect::<Vec<_>>(),
            )));
        }
        self.config = config;
        Ok(())
    }

    /// The states each tensor has, in slot order.
    pub fn state_infos(&self) -> &[StateInfo] {
        &self.infos
    }

    /// The states of tensor `i`, in the order of [`Optim::state_infos`].
    pub fn states(&self, i: usize) -> &[StateBuffer] {
        &self.states[i]
    }
    pub fn states_mut(&mut self, i: usize) -> &mut [StateBuffer] {
        &mut self.states[i]
    }

    /// Successful step calls.
    pub fn steps(&self) -> i64 {
        self.steps
    }

    /// Steps each tensor has made: fewer than [`Optim::steps`] where [`OptimizerConfig::skip_nonfinite`] skipped it.
    pub fn tensor_steps(&self) -> &[i64] {
        &self.tensor_steps
    }

    /// Whether the last step left each tensor untouched (see [`OptimizerConfig::skip_nonfinite`]).
    pub fn last_skipped(&self) -> Vec<bool> {
        self.skipped.iter().map(|&s| s != 0).collect()
    }

    fn check_counts(&self, params: usize, grads: usize) -> Result<()> {
        if params != self.sizes.len() || grads != self.sizes.len() {
            return Err(binding_error(format!(
                "expected {} params and grads, got {params} and {grads}",
                self.sizes.len()
            )));
        }
        Ok(())
    }

    /// One fused step over every tensor, in one library call. `lr` may differ on every call.
    pub fn step<P: Element, G: Element>(&mut self, params: &mut [&mut [P]], grads: &[&[G]], lr: f64) -> Result<()> {
        self.check_counts(params.len(), grads.len())?;
        let raw: Vec<RawSlot> = params
            .iter_mut()
            .zip(grads)
            .zip(self.states.iter_mut())
            .zip(&self.tensor_steps)
            .map(|(((p, g), s), &t)| Slot { param: p, grad: g, states: &mut s[..], step: t + 1 }.raw_mut())
            .collect();
        run_step(&self.config, lr, &raw, Some(&mut self.skipped))?;
        for (t, &s) in self.tensor_steps.iter_mut().zip(&self.skipped) {
            *t += i64::from(s == 0);
        }
        self.steps += 1;
        Ok(())
    }

    /// Every check [`Optim::step`] makes on the same arguments; nothing is written.
    pub fn validate<P: Element, G: Element>(&self, params: &[&[P]], grads: &[&[G]], lr: f64) -> Result<()> {
        self.check_counts(params.len(), grads.len())?;
        let raw: Vec<RawSlot> = params
            .iter()
            .zip(grads)
            .zip(&self.states)
            .zip(&self.tensor_steps)
            .map(|(((p, g), s), &t)| RawSlot {
                param: p.as_ptr() as *mut u8,
                param_len: p.len(),
                param_dtype: P::DTYPE,
                grad: g.as_ptr() as *mut u8,
                grad_len: g.len(),
                grad_dtype: G::DTYPE,
                states: s.iter().map(StateBuffer::raw).collect(),
                step: t + 1,
            })
            .collect();
        run_validate(&self.config, lr, &raw)
    }
}

/// AdamW (or Adam) over a fixed list of tensors, owning their optimizer states: [`Optim`] with
/// [`Optimizer::AdamW`].
#[derive(Clone, Debug)]
pub struct AdamW {
    inner: Optim,
}

impl AdamW {
    /// States for tensors of the given element counts, with the library's defaults (betas 0.9/0.999, eps 1e-8,
    /// weight decay 0.01, AdamW).
    pub fn new(kind: StateKind, sizes: &[usize]) -> Result<Self> {
        let config = OptimizerConfig::new(Optimizer::AdamW)?.state_kind(kind);
        Ok(AdamW { inner: Optim::new(config, sizes)? })
    }

    /// Hyper-parameters; checked by the library on the next step.
    pub fn hyper(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> Self {
        self.inner.config = self.inner.config.betas(betas.0, betas.1).eps(eps).weight_decay(weight_decay);
        self
    }

    /// Adam with L2 decay coupled into the gradient instead of AdamW.
    pub fn coupled_decay(mut self) -> Self {
        self.inner.config = self.inner.config.coupled_decay(true);
        self
    }

    pub fn steps(&self) -> i64 {
        self.inner.steps()
    }

    /// The generic optimizer underneath (config, states).
    pub fn optim(&self) -> &Optim {
        &self.inner
    }

    /// One fused step over every tensor, in one library call. `lr` may differ on every call.
    pub fn step<P: Element, G: Element>(&mut self, params: &mut [&mut [P]], grads: &[&[G]], lr: f64) -> Result<()> {
        self.inner.step(params, grads, lr)
    }
}
