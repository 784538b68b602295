/*
** cpu_attention.c -- the CPU STA forward (temporary: the reference until
** the blocked path lands).
*/
#include "internal.h"

sta_status sta_cpu_attention(const sta_attn_params *p) {
  return sta_cpu_attention_reference(p);
}
