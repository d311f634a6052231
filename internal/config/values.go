package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

var durationType = reflect.TypeFor[time.Duration]()

// checkValues returns an error naming the first key (in key order) of the
// decoded file raw, under prefix, that is not spelled exactly as a key of
// t, or that gives a time.Duration a bare number, or an unsigned integer a
// negative one. The TOML decoder fills a field whose key matches only when
// case is ignored (`Window = 600` sets window) and reports nothing; it
// reads `linger = 5` as 5 ns, which nobody means (a duration must be a
// string with a unit, "5ms", as the flags take it); and it stores -1 in a
// uint64 as 18446744073709551615.
func checkValues(raw map[string]any, t reflect.Type, prefix string) error {
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		ft, ok := keyType(t, k)
		if !ok {
			return misspelled(t, prefix, k)
		}
		if err := checkValue(raw[k], ft, prefix+k); err != nil {
			return err
		}
	}
	return nil
}

func checkValue(v any, t reflect.Type, key string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := v.(type) {
	case int64:
		if t == durationType {
			return fmt.Errorf("%s = %v: a duration needs a unit, such as \"%vms\" or \"%vs\" (a bare number would be read as nanoseconds)", key, v, v, v)
		}
		if v < 0 && t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr {
			return fmt.Errorf("%s = %d: must not be negative", key, v)
		}
	case map[string]any:
		return checkValues(v, t, key+".")
	case []map[string]any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, m := range v {
				if err := checkValues(m, t.Elem(), fmt.Sprintf("%s[%d].", key, i)); err != nil {
					return err
				}
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, e := range v {
				if err := checkValue(e, t.Elem(), fmt.Sprintf("%s[%d]", key, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// keyType is the type that key decodes into within t: a struct's field
// (fields), spelled exactly, or a map's element. Within any other type
// (an interface) every key is t's.
func keyType(t reflect.Type, key string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Map:
		return t.Elem(), true
	case t.Kind() != reflect.Struct:
		return t, true
	}
	for k, ft := range fields(t) {
		if k == key {
			return ft, true
		}
	}
	return nil, false
}

// misspelled is the error for key, under prefix, that is no key of the
// struct t. Load reports the keys the decoder left undecoded before, so
// this one was decoded: into a field whose key differs only in case, or
// into an untagged field by its Go name.
func misspelled(t reflect.Type, prefix, key string) error {
	for k := range fields(t) {
		if strings.EqualFold(k, key) {
			return fmt.Errorf("%s%s: unknown key (keys are case-sensitive): write %s%s", prefix, key, prefix, k)
		}
	}
	return fmt.Errorf("%s%s: unknown key", prefix, key)
}
