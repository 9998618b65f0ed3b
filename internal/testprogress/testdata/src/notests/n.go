package notests

func F() int { return 1 }
