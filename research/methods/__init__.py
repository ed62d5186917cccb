"""The methods a study compares behind one interface (`method.Method`): TokMem itself and every baseline,
each training and answering like TokMem does."""
