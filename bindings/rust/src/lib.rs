//! Rust binding of lbopt: fused AdamW/Adam steps with 4-bit, 8-bit, FP8 or fp32 optimizer states, computed by the
//! lbopt C library on buffers this crate owns (states) and borrows (params, grads).
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
pub mod ffi;

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_int;

/// The kind of optimizer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    Bit4,
    Bit8,
    Fp8,
    Fp32,
}

impl StateKind {
    fn id(self) -> c_int {
        match self {
            StateKind::Bit4 => ffi::LBOPT_STATE_4BIT,
            StateKind::Bit8 => ffi::LBOPT_STATE_8BIT,
            StateKind::Fp8 => ffi::LBOPT_STATE_FP8,
            StateKind::Fp32 => ffi::LBOPT_STATE_FP32,
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

/// A CPU DLTensor over a buffer; the shape lives in the struct that holds it.
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

/// One moment of one tensor: codes (u32 words keep float32 codes aligned) and scales.
struct Moment {
    codes: Vec<u32>,
    scales: Vec<f32>,
    layout: ffi::lbopt_layout,
}

impl Moment {
    fn new(kind: StateKind, numel: usize) -> Result<Self> {
        let mut layout = ffi::lbopt_layout::default();
        // SAFETY: layout is a valid out-pointer of the size passed.
        check(unsafe {
            ffi::lbopt_state_layout(kind.id(), numel as i64, &mut layout, std::mem::size_of::<ffi::lbopt_layout>())
        })?;
        Ok(Moment {
            codes: vec![0; (layout.codes_bytes as usize + 3) / 4],
            scales: vec![0.0; layout.scales_numel as usize],
            layout,
        })
    }
}

/// DLTensor views of a Moment, valid while the Moment is not moved or resized.
struct MomentViews {
    shapes: [i64; 2],
    codes: ffi::DLTensor,
    scales: ffi::DLTensor,
}

/// AdamW (or Adam) over a fixed list of tensors, owning their optimizer states.
pub struct AdamW {
    kind: StateKind,
    config: ffi::lbopt_adamw_config,
    sizes: Vec<usize>,
    m: Vec<Moment>,
    v: Vec<Moment>,
    steps: i64,
}

impl AdamW {
    /// States for tensors of the given element counts, with the library's defaults (betas 0.9/0.999, eps 1e-8,
    /// weight decay 0.01, AdamW).
    pub fn new(kind: StateKind, sizes: &[usize]) -> Result<Self> {
        let mut config = ffi::lbopt_adamw_config::default();
        // SAFETY: config is a valid out-pointer of the size passed.
        check(unsafe { ffi::lbopt_adamw_config_init(&mut config, std::mem::size_of::<ffi::lbopt_adamw_config>()) })?;
        config.state_kind = kind.id();
        let mut m = Vec::new();
        let mut v = Vec::new();
        for &n in sizes {
            m.push(Moment::new(kind, n)?);
            v.push(Moment::new(kind, n)?);
        }
        Ok(AdamW { kind, config, sizes: sizes.to_vec(), m, v, steps: 0 })
    }

    /// Hyper-parameters; checked by the library on the next step.
    pub fn hyper(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> Self {
        self.config.beta1 = betas.0;
        self.config.beta2 = betas.1;
        self.config.eps = eps;
        self.config.weight_decay = weight_decay;
        self
    }

    /// Adam with L2 decay coupled into the gradient instead of AdamW.
    pub fn coupled_decay(mut self) -> Self {
        self.config.flags |= ffi::LBOPT_FLAG_ADAM_COUPLED_DECAY;
        self
    }

    pub fn steps(&self) -> i64 {
        self.steps
    }

    /// One fused step over every tensor, in one library call. `lr` may differ on every call.
    pub fn step<P: Element, G: Element>(&mut self, params: &mut [&mut [P]], grads: &[&[G]], lr: f64) -> Result<()> {
        if params.len() != self.sizes.len() || grads.len() != self.sizes.len() {
            return Err(Error { status: ffi::LBOPT_OK - 1, message: format!(
                "expected {} params and grads, got {} and {}", self.sizes.len(), params.len(), grads.len()) });
        }
        let n = self.sizes.len();
        let mut shapes: Vec<[i64; 2]> = params.iter().zip(grads).map(|(p, g)| [p.len() as i64, g.len() as i64]).collect();
        let mut pg: Vec<[ffi::DLTensor; 2]> = Vec::with_capacity(n);
        for i in 0..n {
            let [ps, gs] = &mut shapes[i];
            pg.push([tensor(params[i].as_mut_ptr().cast(), ps, P::DTYPE), tensor(grads[i].as_ptr() as *mut u8, gs, G::DTYPE)]);
        }
        let mut views: Vec<[MomentViews; 2]> = Vec::with_capacity(n);
        for i in 0..n {
            let make = |mo: &mut Moment| MomentViews {  // shapes are pointed at once the views stop moving
                shapes: [mo.layout.codes_numel, mo.layout.scales_numel],
                codes: tensor(mo.codes.as_mut_ptr().cast(), std::ptr::null_mut(), mo.layout.codes_dtype),
                scales: tensor(mo.scales.as_mut_ptr().cast(), std::ptr::null_mut(), f32::DTYPE),
            };
            views.push([make(&mut self.m[i]), make(&mut self.v[i])]);
        }
        let plain = self.kind == StateKind::Fp32;
        let mut slots = Vec::with_capacity(n);
        for i in 0..n {
            for mv in views[i].iter_mut() {
                mv.codes.shape = &mut mv.shapes[0];
                mv.scales.shape = &mut mv.shapes[1];
            }
            let state = |mv: &MomentViews| ffi::lbopt_state {
                codes: &mv.codes,
                scales: if plain { std::ptr::null() } else { &mv.scales },
            };
            slots.push(ffi::lbopt_adamw_slot {
                struct_size: std::mem::size_of::<ffi::lbopt_adamw_slot>() as u32,
                param: &pg[i][0],
                grad: &pg[i][1],
                m: state(&views[i][0]),
                v: state(&views[i][1]),
                vmax: ffi::lbopt_state { codes: std::ptr::null(), scales: std::ptr::null() },
                step: self.steps + 1,
            });
        }
        // SAFETY: every pointer refers to a live buffer of the size its DLTensor states (the library validates the
        // sizes, dtypes and overlaps again); params are exclusively borrowed for the call.
        check(unsafe { ffi::lbopt_adamw_step(&self.config, lr, slots.as_ptr(), n, std::ptr::null()) })?;
        self.steps += 1;
        Ok(())
    }
}
