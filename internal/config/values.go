package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"
)

var durationType = reflect.TypeFor[time.Duration]()

// checkDurations returns an error naming the first key (in key order) of
// the decoded file raw, under prefix, that gives a time.Duration of type t
// a bare number. The TOML decoder reads `linger = 5` as 5 ns, which nobody
// means; a duration must be a string with a unit ("5ms"), as the flags
// take it.
func checkDurations(raw map[string]any, t reflect.Type, prefix string) error {
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		ft, ok := keyType(t, k)
		if !ok {
			continue // an unknown key: Load names it
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
	case map[string]any:
		return checkDurations(v, t, key+".")
	case []map[string]any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, m := range v {
				if err := checkDurations(m, t.Elem(), fmt.Sprintf("%s[%d].", key, i)); err != nil {
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
// (fields) or a map's element.
func keyType(t reflect.Type, key string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Map {
		return t.Elem(), true
	}
	for k, ft := range fields(t) {
		if k == key {
			return ft, true
		}
	}
	return nil, false
}
