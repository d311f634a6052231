package analytics

import "reflect"

func newScan(t reflect.Type) any { return reflect.New(t).Interface() }

func deref(p any) any {
	v := reflect.ValueOf(p).Elem()
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	return v.Interface()
}
