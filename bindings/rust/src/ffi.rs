//! `#[repr(C)]` declarations of the DLPack tensor and the lbopt C ABI (abi/lbopt.h), ABI 0.3 (major 0).
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
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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
/// SGD (lbopt_step only): Nesterov momentum; needs momentum > 0 and dampening = 0. Since 0.3.
pub const LBOPT_FLAG_NESTEROV: u32 = 0x20;
/// Round the codes of quantized first-moment states stochastically. Since 0.4.
pub const LBOPT_FLAG_STATE_STOCHASTIC_ROUND: u32 = 0x40;
/// Round them to nearest; neither flag: the optimizer's and kind's default. Since 0.4.
pub const LBOPT_FLAG_STATE_NEAREST_ROUND: u32 = 0x80;
/// AdEMAMix: nu on the unsigned map (4-bit: the linear one, as lbopt 0.3 kept it). Since 0.4.
pub const LBOPT_FLAG_NU_LINEAR_MAP: u32 = 0x100;
/// The flags lbopt_adamw_config knows.
pub const LBOPT_FLAGS_ALL: u32 = 0xDF;

pub const LBOPT_MOMENT_FIRST: c_int = 0;
pub const LBOPT_MOMENT_SECOND: c_int = 1;
pub const LBOPT_MOMENT_SECOND_SIGNED: c_int = 2;
/// lbopt_attr_type: the type of an lbopt_field_info (since 0.4).
pub const LBOPT_ATTR_DOUBLE: i32 = 0;
pub const LBOPT_ATTR_BOOL: i32 = 2;

/// lbopt_optimizer (since 0.3).
pub const LBOPT_OPTIMIZER_ADAMW: c_int = 0;
pub const LBOPT_OPTIMIZER_SGD: c_int = 1;
pub const LBOPT_OPTIMIZER_LION: c_int = 2;
pub const LBOPT_OPTIMIZER_ADEMAMIX: c_int = 3;
pub const LBOPT_OPTIMIZER_MUON: c_int = 4;

pub const LBOPT_MAX_STATES: usize = 3;

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
    pub flags: u32,
}

/// The generic step's config (since 0.3): one struct whose fields each optimizer reads or ignores.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct lbopt_optimizer_config {
    pub struct_size: u32,
    pub optimizer: c_int,
    pub state_kind: c_int,
    pub flags: u32,
    pub seed: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub beta3: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub alpha: f64,
    pub t_alpha: f64,
    pub t_beta3: f64,
}

/// One state of an optimizer: its name (static text) and its lbopt_moment.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lbopt_state_info {
    pub name: *const c_char,
    pub moment: i32,
}

impl Default for lbopt_state_info {
    fn default() -> Self {
        lbopt_state_info { name: std::ptr::null(), moment: 0 }
    }
}

/// One hyper-parameter or flag an optimizer reads (lbopt_optimizer_fields; since 0.4).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lbopt_field_info {
    pub name: *const c_char,
    pub type_: i32, // LBOPT_ATTR_DOUBLE for a field, LBOPT_ATTR_BOOL for a flag
    pub flag: u32,
    pub default_value: f64,
    pub min: f64,
    pub max: f64,
    pub max_inclusive: i32,
    pub reserved: i32,
}

/// One parameter tensor and its states for lbopt_step: states[0 .. n) are the optimizer's, the rest {NULL, NULL}.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lbopt_slot {
    pub struct_size: u32,
    pub param: *const DLTensor,
    pub grad: *const DLTensor,
    pub states: [lbopt_state; LBOPT_MAX_STATES],
    pub step: i64,
}

extern "C" {
    pub fn lbopt_version() -> u32;
    pub fn lbopt_version_string() -> *const c_char;
    pub fn lbopt_status_string(status: lbopt_status) -> *const c_char;
    pub fn lbopt_last_error() -> *const c_char;
    pub fn lbopt_build_info() -> *const c_char;
    pub fn lbopt_state_kind_name(kind: c_int) -> *const c_char;
    pub fn lbopt_state_layout(kind: c_int, numel: i64, out: *mut lbopt_layout, out_size: usize) -> lbopt_status;
    pub fn lbopt_state_init(kind: c_int, numel: i64, state: lbopt_state, stream: *mut c_void) -> lbopt_status;
    pub fn lbopt_quantize(
        kind: c_int,
        moment: c_int,
        src: *const DLTensor,
        dst: lbopt_state,
        stream: *mut c_void,
    ) -> lbopt_status;
    pub fn lbopt_dequantize(
        kind: c_int,
        moment: c_int,
        src: lbopt_state,
        dst: *const DLTensor,
        stream: *mut c_void,
    ) -> lbopt_status;
    pub fn lbopt_step_options_init(options: *mut lbopt_step_options, struct_size: usize) -> lbopt_status;
    pub fn lbopt_adamw_config_init(config: *mut lbopt_adamw_config, struct_size: usize) -> lbopt_status;
    pub fn lbopt_adamw_step(
        config: *const lbopt_adamw_config,
        lr: f64,
        slots: *const lbopt_adamw_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;
    pub fn lbopt_adamw_config_validate(config: *const lbopt_adamw_config, lr: f64) -> lbopt_status;
    pub fn lbopt_adamw_step_validate(
        config: *const lbopt_adamw_config,
        lr: f64,
        slots: *const lbopt_adamw_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;
    pub fn lbopt_adamw_step_capturable(
        config: *const lbopt_adamw_config,
        lr: *const DLTensor,
        step: *const DLTensor,
        slots: *const lbopt_adamw_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;

    // The generic step (since 0.3).
    pub fn lbopt_optimizer_config_init(
        config: *mut lbopt_optimizer_config,
        struct_size: usize,
        optimizer: c_int,
    ) -> lbopt_status;
    pub fn lbopt_optimizer_config_validate(config: *const lbopt_optimizer_config, lr: f64) -> lbopt_status;
    pub fn lbopt_optimizer_name(optimizer: c_int) -> *const c_char;
    pub fn lbopt_optimizer_states(
        config: *const lbopt_optimizer_config,
        states: *mut lbopt_state_info, // [LBOPT_MAX_STATES]
        n_states: *mut usize,
    ) -> lbopt_status;
    pub fn lbopt_optimizer_fields(
        optimizer: c_int,
        fields: *mut *const lbopt_field_info,
        n_fields: *mut usize,
    ) -> lbopt_status;
    pub fn lbopt_optimizer_config_set(
        config: *mut lbopt_optimizer_config,
        name: *const c_char,
        value: f64,
    ) -> lbopt_status;
    pub fn lbopt_step(
        config: *const lbopt_optimizer_config,
        lr: f64,
        slots: *const lbopt_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;
    pub fn lbopt_step_validate(
        config: *const lbopt_optimizer_config,
        lr: f64,
        slots: *const lbopt_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;
    pub fn lbopt_step_capturable(
        config: *const lbopt_optimizer_config,
        lr: *const DLTensor,
        step: *const DLTensor,
        slots: *const lbopt_slot,
        n_slots: usize,
        options: *const lbopt_step_options,
    ) -> lbopt_status;

    pub fn lbopt_set_num_threads(n: c_int) -> lbopt_status;
    pub fn lbopt_get_num_threads() -> c_int;
}

// The C layouts on LP64 targets (x86_64, aarch64 Linux and macOS), as offsetof/sizeof in C give them.
#[cfg(all(test, target_pointer_width = "64"))]
mod layout_tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn dlpack_layout() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    }

    #[test]
    fn state_and_adamw_layout() {
        assert_eq!(size_of::<lbopt_layout>(), 40);
        assert_eq!(offset_of!(lbopt_layout, codes_dtype), 4);
        assert_eq!(offset_of!(lbopt_layout, codes_numel), 8);
        assert_eq!(offset_of!(lbopt_layout, block_size), 32);
        assert_eq!(size_of::<lbopt_state>(), 16);
        assert_eq!(size_of::<lbopt_adamw_config>(), 56);
        assert_eq!(offset_of!(lbopt_adamw_config, state_kind), 4);
        assert_eq!(offset_of!(lbopt_adamw_config, beta1), 8);
        assert_eq!(offset_of!(lbopt_adamw_config, flags), 40);
        assert_eq!(offset_of!(lbopt_adamw_config, seed), 48);
        assert_eq!(size_of::<lbopt_adamw_slot>(), 80);
        assert_eq!(offset_of!(lbopt_adamw_slot, param), 8);
        assert_eq!(offset_of!(lbopt_adamw_slot, m), 24);
        assert_eq!(offset_of!(lbopt_adamw_slot, v), 40);
        assert_eq!(offset_of!(lbopt_adamw_slot, vmax), 56);
        assert_eq!(offset_of!(lbopt_adamw_slot, step), 72);
        assert_eq!(size_of::<lbopt_step_options>(), 48);
        assert_eq!(offset_of!(lbopt_step_options, grad_scale), 8);
        assert_eq!(offset_of!(lbopt_step_options, stream), 32);
        assert_eq!(offset_of!(lbopt_step_options, flags), 40);
    }

    #[test]
    fn generic_step_layout() {
        assert_eq!(size_of::<lbopt_optimizer_config>(), 104);
        assert_eq!(align_of::<lbopt_optimizer_config>(), 8);
        assert_eq!(offset_of!(lbopt_optimizer_config, optimizer), 4);
        assert_eq!(offset_of!(lbopt_optimizer_config, state_kind), 8);
        assert_eq!(offset_of!(lbopt_optimizer_config, flags), 12);
        assert_eq!(offset_of!(lbopt_optimizer_config, seed), 16);
        assert_eq!(offset_of!(lbopt_optimizer_config, beta1), 24);
        assert_eq!(offset_of!(lbopt_optimizer_config, beta2), 32);
        assert_eq!(offset_of!(lbopt_optimizer_config, beta3), 40);
        assert_eq!(offset_of!(lbopt_optimizer_config, eps), 48);
        assert_eq!(offset_of!(lbopt_optimizer_config, weight_decay), 56);
        assert_eq!(offset_of!(lbopt_optimizer_config, momentum), 64);
        assert_eq!(offset_of!(lbopt_optimizer_config, dampening), 72);
        assert_eq!(offset_of!(lbopt_optimizer_config, alpha), 80);
        assert_eq!(offset_of!(lbopt_optimizer_config, t_alpha), 88);
        assert_eq!(offset_of!(lbopt_optimizer_config, t_beta3), 96);
        assert_eq!(size_of::<lbopt_field_info>(), 48);
        assert_eq!(offset_of!(lbopt_field_info, default_value), 16);
        assert_eq!(offset_of!(lbopt_field_info, max_inclusive), 40);
        assert_eq!(size_of::<lbopt_state_info>(), 16);
        assert_eq!(offset_of!(lbopt_state_info, moment), 8);
        assert_eq!(size_of::<lbopt_slot>(), 80);
        assert_eq!(offset_of!(lbopt_slot, param), 8);
        assert_eq!(offset_of!(lbopt_slot, grad), 16);
        assert_eq!(offset_of!(lbopt_slot, states), 24);
        assert_eq!(offset_of!(lbopt_slot, step), 72);
    }

    #[test]
    fn library_takes_these_struct_sizes() {
        // The library refuses a struct_size it does not know: the sizes above are the ones it was built with.
        unsafe {
            let mut c = lbopt_optimizer_config::default();
            assert_eq!(lbopt_optimizer_config_init(&mut c, size_of::<lbopt_optimizer_config>(), LBOPT_OPTIMIZER_SGD), 0);
            assert_eq!(c.struct_size as usize, size_of::<lbopt_optimizer_config>());
            assert_eq!(c.optimizer, LBOPT_OPTIMIZER_SGD);
            assert_eq!(lbopt_optimizer_config_validate(&c, 0.1), 0);
            let mut o: lbopt_step_options = std::mem::zeroed();
            assert_eq!(lbopt_step_options_init(&mut o, size_of::<lbopt_step_options>()), 0);
            assert_eq!(o.struct_size as usize, size_of::<lbopt_step_options>());
        }
    }
}
