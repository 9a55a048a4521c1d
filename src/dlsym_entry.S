/* dlsym_entry.S — the exported dlsym, on x86-64 and AArch64: asks cualloc_dlsym_route (interpose.c)
 * where the call goes, then jumps there with the caller's arguments and return address untouched.
 * glibc's dlsym finds "the caller" from its return address: RTLD_DEFAULT searches the caller's
 * scope (its own dependencies too, for an object loaded RTLD_LOCAL) and RTLD_NEXT the objects
 * after the caller. Reached by a call from C, it would see libcualloc.so as the caller instead,
 * and answer NULL or the wrong definition (a Python extension module looking up its own
 * dependency's symbol, a malloc wrapper asking for the next malloc). A jump keeps the caller. */
#if !defined(CUALLOC_NO_DLSYM_INTERPOSE) && (defined(__x86_64__) || defined(__aarch64__))
        .text
        .globl  dlsym
        .type   dlsym, %function
        .p2align 4
dlsym:
        .cfi_startproc
#if defined(__x86_64__)
#ifdef __CET__
        endbr64
#endif
        push    %rdi                    /* handle */
        .cfi_adjust_cfa_offset 8
        push    %rsi                    /* symbol */
        .cfi_adjust_cfa_offset 8
        sub     $8, %rsp                /* 16-byte alignment for the call */
        .cfi_adjust_cfa_offset 8
        mov     %rsi, %rdi
        call    cualloc_dlsym_route
        add     $8, %rsp
        .cfi_adjust_cfa_offset -8
        pop     %rsi
        .cfi_adjust_cfa_offset -8
        pop     %rdi
        .cfi_adjust_cfa_offset -8
        jmp     *%rax
#else /* __aarch64__ */
        stp     x29, x30, [sp, #-32]!
        .cfi_def_cfa_offset 32
        .cfi_offset 29, -32
        .cfi_offset 30, -24
        mov     x29, sp
        stp     x0, x1, [sp, #16]       /* handle, symbol */
        mov     x0, x1
        bl      cualloc_dlsym_route
        mov     x16, x0
        ldp     x0, x1, [sp, #16]
        ldp     x29, x30, [sp], #32
        .cfi_def_cfa_offset 0
        .cfi_restore 29
        .cfi_restore 30
        br      x16
#endif
        .cfi_endproc
        .size   dlsym, .-dlsym
#endif
        .section .note.GNU-stack,"",%progbits
