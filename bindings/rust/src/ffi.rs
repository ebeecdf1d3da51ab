//! `#[repr(C)]` declarations of the DLPack tensor and the lbopt C ABI (abi/lbopt.h), ABI major 0.
#![allow(non_camel_case_types, dead_code)]
use std::os::raw::{c_char, c_int, c_void};

pub const ABI_MAJOR: u32 = 0;

pub const KDL_CPU: c_int = 1;
pub const KDL_INT: u8 = 0;
pub const KDL_UINT: u8 = 1;
pub const KDL_FLOAT: u8 = 2;
pub const KDL_BFLOAT: u8 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DLDevice {
    pub device_type: c_int,
    pub device_id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: c_int,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

pub type lbopt_status = c_int;
pub const LBOPT_OK: lbopt_status = 0;

pub const LBOPT_STATE_4BIT: c_int = 0;
pub const LBOPT_STATE_8BIT: c_int = 1;
pub const LBOPT_STATE_FP8: c_int = 2;
pub const LBOPT_STATE_FP32: c_int = 3;

pub const LBOPT_FLAG_ADAM_COUPLED_DECAY: u32 = 0x1;
pub const LBOPT_FLAG_AMSGRAD: u32 = 0x2;
pub const LBOPT_FLAG_MAXIMIZE: u32 = 0x4;
pub const LBOPT_FLAG_BF16_STOCHASTIC_ROUND: u32 = 0x8;
pub const LBOPT_FLAG_SKIP_NONFINITE: u32 = 0x10;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct lbopt_layout {
    pub struct_size: u32,
    pub codes_dtype: DLDataType,
    pub codes_numel: i64,
    pub codes_bytes: i64,
    pub scales_numel: i64,
    pub block_size: i64,
}

impl Default for DLDataType {
    fn default() -> Self {
        DLDataType { code: 0, bits: 0, lanes: 0 }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lbopt_state {
    pub codes: *const DLTensor,
    pub scales: *const DLTensor,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct lbopt_adamw_config {
    pub struct_size: u32,
    pub state_kind: c_int,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub flags: u32,
    pub seed: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lbopt_adamw_slot {
    pub struct_size: u32,
    pub param: *const DLTensor,
    pub grad: *const DLTensor,
    pub m: lbopt_state,
    pub v: lbopt_state,
    pub vmax: lbopt_state,
    pub step: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lbopt_step_options {
    pub struct_size: u32,
    pub grad_scale: *const DLTensor,
    pub found_inf: *const DLTensor,
    pub skipped: *const DLTensor,
    pub stream: *mut c_void,
}

extern "C" {
    pub fn lbopt_version() -> u32;
    pub fn lbopt_version_string() -> *const c_char;
    pub fn lbopt_status_string(status: lbopt_status) -> *const c_char;
    pub fn lbopt_last_error() -> *const c_char;
    pub fn lbopt_state_layout(kind: c_int, numel: i64, out: *mut lbopt_layout, out_size: usize) -> lbopt_status;
    pub fn lbopt_state_init(kind: c_int, numel: i64, state: lbopt_state, stream: *mut c_void) -> lbopt_status;
    pub fn lbopt_adamw_config_init(config: *mut lbopt_adamw_config, struct_size: usize) -> lbopt_status;
    pub fn lbopt_adamw_step(
        config: *const lbopt_adamw_config,
        lr: f64,
        slots: *const lbopt_adamw_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;
}
